"""`python -m localgen` entry point."""

from localgen.cli.main import main

if __name__ == "__main__":
    main()
