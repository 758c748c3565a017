"""Agents built on replaygpu's public API: DQN, SAC and distributed Ape-X DQN, plus demos.

Each algorithm is one file that reads top to bottom (``dqn.py``, ``sac.py``, ``apex.py``); shared
helpers live beside them (``envs.py``, ``networks.py``, ``flags.py``, ``progress.py``).
"""
