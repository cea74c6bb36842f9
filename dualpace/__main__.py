from dualpace.cli import main

raise SystemExit(main())
