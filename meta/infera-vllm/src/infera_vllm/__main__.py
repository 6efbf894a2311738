from infera_vllm.cli import main

raise SystemExit(main())
