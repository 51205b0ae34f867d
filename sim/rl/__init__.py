"""Training SCHED²'s Q-network in the simulator (``trellis-sim train sched2``).

PyTorch is an optional extra (``pip install -e '.[rl]'``); nothing outside this package
imports it, and the master and the replays run the exported weights with numpy
(``masterd.core.sched2.network``).

- ``qnet``: the network of Eq. 3–5 in PyTorch, and its export to the ``.npz`` format;
- ``replay``: prioritized experience replay (Schaul et al., proportional variant);
- ``dqn``: the DQN learner and the ε-greedy agent the ``sched2`` policy consults while training;
- ``train``: episodes in the simulator, the training curve and the record of the run.
"""
