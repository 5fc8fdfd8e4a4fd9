"""``python -m serving.engine``: the tsctl engine (main.py)."""

from .main import main

main()
