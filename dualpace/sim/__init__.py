"""``dualpace simulate``: the production scheduler (LLMEngine, its GPU and CPU rounds, the
policies, Eq. 2 accounting, migrations, Dense Assist routing) on a virtual clock, with the
worker processes replaced by per-step cost models (Vidur-style, MLSys'24)."""
