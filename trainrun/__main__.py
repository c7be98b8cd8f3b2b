from trainrun.commands import main

raise SystemExit(main())
