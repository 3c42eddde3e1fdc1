"""Plain-PyTorch reference of the EPLB planner: the test oracle and the benchmarks' baseline.

It is the original algorithm (greedy packing, greedy replication) written with torch ops and
Python loops. Arithmetic is float64 and every tie goes to the lower index, exactly as in the C++
core, so for the default options both return identical plans.
"""
import torch


def balanced_packing(weight: torch.Tensor, num_packs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy heaviest-first packing into packs that each take the same number of items.

    weight: [rows, items] float64, items % num_packs == 0.
    Returns pack_index, rank_in_pack: [rows, items] int64 (pack of each item, its slot in the pack).
    Each item goes to the lightest pack that still has room; with one item per pack, item i -> pack i.
    """
    rows, items = weight.shape
    per_pack = items // num_packs
    if per_pack == 1:
        index = torch.arange(items).expand(rows, items).clone()
        return index, torch.zeros_like(index)
    pack_index = torch.empty(rows, items, dtype=torch.int64)
    rank_in_pack = torch.empty_like(pack_index)
    order = weight.sort(dim=-1, descending=True, stable=True).indices
    for r in range(rows):
        load, count = [0.0] * num_packs, [0] * num_packs
        w = weight[r].tolist()
        for item in order[r].tolist():
            pack = min((p for p in range(num_packs) if count[p] < per_pack), key=load.__getitem__)
            pack_index[r, item], rank_in_pack[r, item] = pack, count[pack]
            load[pack] += w[item]
            count[pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(weight: torch.Tensor, num_phy: int) -> tuple[torch.Tensor, ...]:
    """Adds replicas one at a time to the expert with the highest load per replica.

    weight: [rows, num_log] float64, num_phy >= num_log.
    Returns phy2log [rows, num_phy] (slot i < num_log holds expert i), phy_rank [rows, num_phy]
    (replica index of each slot) and logcnt [rows, num_log] (replicas per expert), all int64.
    """
    rows, num_log = weight.shape
    phy2log = torch.arange(num_phy).repeat(rows, 1)
    phy_rank = torch.zeros(rows, num_phy, dtype=torch.int64)
    logcnt = torch.ones(rows, num_log, dtype=torch.int64)
    r = torch.arange(rows)
    for slot in range(num_log, num_phy):
        hot = (weight / logcnt).argmax(dim=-1)
        phy2log[:, slot] = hot
        phy_rank[:, slot] = logcnt[r, hot]
        logcnt[r, hot] += 1
    return phy2log, phy_rank, logcnt


def rebalance_hierarchical(weight: torch.Tensor, num_phy: int, num_groups: int, num_nodes: int,
                           num_gpus: int) -> tuple[torch.Tensor, ...]:
    """Groups -> nodes, replicas within each node, replicas -> GPUs of the node.

    weight: [L, E] float64. Returns phy2log, phy_rank [L, num_phy] and logcnt [L, E], int64.
    """
    L, E = weight.shape
    group_size, per_node = E // num_groups, E // num_nodes
    # 1. pack groups onto nodes; "mlog" numbers experts node-major: node, group slot, position
    group_w = weight.view(L, num_groups, group_size)
    group_load = group_w[..., 0].clone()
    for j in range(1, group_size):  # sequential sum, the same order as the C++ core
        group_load += group_w[..., j]
    gpack, grank = balanced_packing(group_load, num_nodes)
    log2mlog = (((gpack * (num_groups // num_nodes) + grank) * group_size).unsqueeze(-1)
                + torch.arange(group_size)).flatten(-2)
    mlog2log = log2mlog.argsort(dim=-1)
    # 2. replicate within each node: rows are (layer, node)
    node_w = weight.gather(-1, mlog2log).view(L * num_nodes, per_node)
    phy2mlog, phy_rank, mlogcnt = replicate_experts(node_w, num_phy // num_nodes)
    # 3. pack the node's physical experts onto its GPUs
    phy_w = (node_w / mlogcnt).gather(-1, phy2mlog)
    pack, rank = balanced_packing(phy_w, num_gpus // num_nodes)
    slot2phy = (pack * (num_phy // num_gpus) + rank).argsort(dim=-1)
    slot2mlog = phy2mlog.gather(-1, slot2phy).view(L, num_nodes, num_phy // num_nodes)
    slot2mlog = (slot2mlog + per_node * torch.arange(num_nodes).view(1, -1, 1)).flatten(-2)
    phy2log = mlog2log.gather(-1, slot2mlog)
    phy_rank = phy_rank.gather(-1, slot2phy).view(L, num_phy)
    logcnt = mlogcnt.view(L, E).gather(-1, log2mlog)
    return phy2log, phy_rank, logcnt


def rebalance_experts(weight: torch.Tensor, num_replicas: int, num_groups: int, num_nodes: int,
                      num_gpus: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Reference of :func:`eplb.rebalance_experts` with default options (inputs assumed valid).

    weight: [L, E] loads. Returns phy2log [L, num_replicas], log2phy [L, E, max_replicas]
    (padded with -1) and logcnt [L, E], int64 on the CPU.
    """
    weight = weight.detach().double().cpu()
    L, E = weight.shape
    if num_groups % num_nodes == 0:
        phy2log, phy_rank, logcnt = rebalance_hierarchical(weight, num_replicas, num_groups,
                                                           num_nodes, num_gpus)
    else:  # global policy: one group on one node
        phy2log, phy_rank, logcnt = rebalance_hierarchical(weight, num_replicas, 1, 1, num_gpus)
    return phy2log, make_log2phy(phy2log, phy_rank, logcnt), logcnt


def make_log2phy(phy2log: torch.Tensor, phy_rank: torch.Tensor, logcnt: torch.Tensor) -> torch.Tensor:
    """log2phy [L, E, max_replicas]: slot of replica r of expert e, -1 past logcnt[l, e]."""
    L, E = logcnt.shape
    width = int(logcnt.max()) if logcnt.numel() else 1
    log2phy = torch.full((L, E * width), -1, dtype=torch.int64)
    log2phy.scatter_(-1, phy2log * width + phy_rank,
                     torch.arange(phy2log.shape[-1]).expand_as(phy2log).contiguous())
    return log2phy.view(L, E, width)


def gpu_loads(weight: torch.Tensor, phy2log: torch.Tensor, num_gpus: int) -> torch.Tensor:
    """Load of each GPU when every expert's load is split evenly over its replicas.

    weight: [L, E], phy2log: [L, R] with R % num_gpus == 0. Returns [L, num_gpus] float64.
    """
    weight = weight.double()
    cnt = torch.zeros_like(weight).scatter_add_(-1, phy2log, torch.ones_like(phy2log, dtype=weight.dtype))
    per_slot = (weight / cnt.clamp(min=1)).gather(-1, phy2log)
    return per_slot.view(phy2log.shape[0], num_gpus, phy2log.shape[1] // num_gpus).sum(-1)
