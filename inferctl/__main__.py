"""``python -m inferctl`` runs the ``inferctl`` command (the front door, ``inferctl.cli``)."""

from inferctl.cli import main

if __name__ == "__main__":
    main()
