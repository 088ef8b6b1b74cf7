"""Lets `python -m meshrun train ...` behave like the `meshrun` console script."""

from meshrun.cli import main

if __name__ == "__main__":
    main()
