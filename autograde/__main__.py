from autograde.cli import main

if __name__ == "__main__":  # not when a worker process re-imports this module
    raise SystemExit(main())
