"""The source papers' own figures (docs/PAPERS.md), as data: what `geodt paper` sets its results beside.

Nothing here is computed or measured by geodt; every number is copied from the digest of the
papers in docs/PAPERS.md (000: the DiLoCo idle-time paper; 001: DDP across A30 and Titan Xp nodes;
002: batch size against training time under Horovod).
"""
from __future__ import annotations

# 000, Table 1: node -> [(catalog key, count, the paper's FP16/BF16 TFLOPS, datasheet memory GB)]
TABLE1 = {
    "node1": [("rtx-2080-ti", 4, 113.8, 11)],
    "node2": [("rtx-2080-ti", 3, 113.8, 11), ("titan-rtx", 1, 130.0, 24)],
    "node3": [("a30", 4, 165.0, 24)],
    "node4": [("rtx-3090", 2, 142.0, 24), ("v100-pcie", 2, 125.0, 32)],
}
# The paper writes "V100"; its 125 TFLOPS is the SXM2 headline, but beside two RTX 3090s in one
# server the card is most likely the PCIe V100 (simulator/scenarios/paper.toml says why).

# 000, Table 2, as printed (average TFLOPS to one decimal, normalised to three).
TABLE2_AVG_TFLOPS = {"node1": 113.8, "node2": 117.9, "node3": 165.0, "node4": 133.5}
TABLE2_NORMALIZED = {"node1": 1.000, "node2": 1.036, "node3": 1.450, "node4": 1.173}
TABLE2_BATCH = {"A": {"node1": 4, "node2": 4, "node3": 6, "node4": 5},
                "B": {"node1": 8, "node2": 8, "node3": 32, "node4": 16}}
TABLE2_LOCAL_STEPS = {"C": {"node1": 100, "node2": 104, "node3": 145, "node4": 117}}

# 000, Table 3: measured GPU idle time in seconds, summed over the 10 syncs.
TABLE3_IDLE_S = {
    "baseline": {"node1": 1.1, "node2": 0.0, "node3": 14.6, "node4": 4.9},
    "A": {"node1": 11.9, "node2": 0.0, "node3": 14.7, "node4": 13.8},
    "B": {"node1": 6.8, "node2": 7.2, "node3": 0.0, "node4": 14.4},
    "C": {"node1": 2.1, "node2": 0.0, "node3": 8.6, "node4": 1.9},
}
TABLE3_TOTAL_S = {"baseline": 20.6, "A": 40.4, "B": 28.4, "C": 12.6}
PAPER_STRATEGIES = ("baseline", "A", "B", "C")

# 002: ResNet-18 on CIFAR-10 with Horovod on 4x T4; batch -> training time (s), accuracy, loss.
P002_BATCH = (8, 16, 32, 64, 128, 256)
P002_TIME_S = (14892.0, 8282.0, 5379.0, 2977.0, 2300.0, 2069.0)
P002_ACCURACY = (0.3282, 0.9106, 0.9381, 0.9464, 0.9465, 0.8907)
P002_LOSS = (1.7422, 0.2614, 0.1765, 0.1490, 0.1497, 0.3073)
P002_GPUS = 4
P002_GPU = "t4"

# 001: minGPT on TinyShakespeare, node A = 2x A30, node B = 4x Titan Xp. The paper's only
# quantitative timing statement: node B's run took twice as long as node A's.
P001_NODE_A = ("a30", 2)
P001_NODE_B = ("titan-xp", 4)
P001_B_OVER_A_TIME = 2.0
