"""`python -m rewards score IN.jsonl --out OUT.jsonl [overrides]` (see rewards/cli.py)."""

# The guard matters: the reward process pool uses forkserver, whose workers import the main module.
if __name__ == "__main__":
    import sys

    from rewards.cli import main

    sys.exit(main())
