"""Network bandwidth partitioning on a node's data NIC (SODA §V-E).

While a node hosts a multi-node GPU job, GPU jobs are guaranteed 75% of the data NIC and CPU
jobs 25% (configurable); either may use the whole link when the other is idle.

- :mod:`.htb` — ``TrafficShaper``: the HTB hierarchy through pyroute2, and restoring the
  interface's original root qdisc.
- :mod:`.classify` — ``JobClassifier`` and its cgroup v2 and v1 (net_cls) implementations:
  an nftables output rule sets each packet's ``skb->priority`` to its HTB class id, which HTB
  honours before any filter. How each works is in that module's docstring.
- :mod:`.partition` — ``BandwidthPartitioner``: installs the partition when the first multi-node
  GPU job starts on the node and removes it when the last one ends or noded stops.
- :mod:`.nft` — running ``nft`` in a network namespace with cgroup v2 paths resolvable.

Requires: pyroute2, the ``nft`` tool (package nftables), util-linux (nsenter, unshare), kernel
with sch_htb, nf_tables and nft_socket (cgroup v2) or the net_cls controller (v1).
"""

from noded.netshape.classify import (
    CgroupV2Classifier,
    JobClassifier,
    JobNetKind,
    NetClsClassifier,
)
from noded.netshape.errors import NetShapeError
from noded.netshape.htb import RootQdisc, TrafficShaper, plan_classes
from noded.netshape.partition import BandwidthPartitioner, NetJob

__all__ = [
    "BandwidthPartitioner",
    "CgroupV2Classifier",
    "JobClassifier",
    "JobNetKind",
    "NetClsClassifier",
    "NetJob",
    "NetShapeError",
    "RootQdisc",
    "TrafficShaper",
    "plan_classes",
]
