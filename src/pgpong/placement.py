"""Where a pool's workers and matches go: pure arithmetic, shared by the pools, bench
and the model of seconds per update (scaling/model.py)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable

MAX_WORKERS_PER_CPU = 4.0  # rollout workers a CPU, at most (each holds 250-350 MB)
AUTO = "auto"  # --workers-per-cpu auto: a worker for each of a batch's matches, if 4 a CPU or fewer do


def shares(workers: int, cpus: list[int]) -> list[int]:
    """`workers` spread over nodes with these CPUs: each node's share in proportion
    to its CPUs (largest remainders first), never more than it has."""
    total = sum(cpus)
    workers = min(workers, total)
    exact = [workers * c / total for c in cpus]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(cpus)), key=lambda i: exact[i] - counts[i], reverse=True)[: workers - sum(counts)]:
        counts[i] += 1
    return counts


def node_workers(cpus: int, per_cpu: float) -> int:
    """The rollout workers a node of `cpus` CPUs runs at `per_cpu` workers a CPU (each
    asks Ray for 1 / per_cpu of a CPU, cut to Ray's 0.0001: cpu_share)."""
    return max(1, int(cpus / cpu_share(per_cpu) + 1e-9)) if cpus else 0


def cluster_workers(cpus: list[int], per_cpu: float, matches: int | None = None) -> int:
    """The rollout workers a cluster of nodes with these CPUs runs at `per_cpu` workers
    a CPU: node_workers of each; above 1 no more than a batch of `matches` needs, or
    than the CPUs if they are more (a worker for each match, all in play at once,
    spread over the nodes by their CPUs: more would let the first nodes to ask the
    queue take a match for each of their free workers, and leave others idle)."""
    room = sum(node_workers(c, per_cpu) for c in cpus)
    return room if per_cpu <= 1 or matches is None else min(room, max(sum(cpus), matches))


def auto_per_cpu(matches: int | None, cpus: list[int], most: float = MAX_WORKERS_PER_CPU) -> float:
    """--workers-per-cpu auto: the fewest workers a CPU (up to `most`) at which nodes
    with these CPUs have room for a worker for every match of a batch of `matches`
    (node_workers), so that all start at once and each node's cores are shared; 1 if
    the batch fits the CPUs, or if it would need more than `most` (then some would wait
    for a worker, and a second wave on shared cores gains nothing)."""
    if not matches or matches <= sum(cpus):
        return 1.0
    # where a node's room grows: k workers on c CPUs at k / c a CPU
    steps = sorted({k / c for c in set(cpus) if c for k in range(c + 1, int(most * c) + 1)})
    return next((n for n in steps if sum(node_workers(c, n) for c in cpus) >= matches), 1.0)


def per_cpu_for(asked: float | str, matches: int | None, cpus: list[int]) -> float:
    """The workers a CPU that --workers-per-cpu `asked` gives for a batch of `matches` on
    nodes with these CPUs: auto's pick (auto_per_cpu), or the number asked."""
    return auto_per_cpu(matches, cpus) if asked == AUTO else float(asked)


def cpu_share(per_cpu: float) -> float:
    """What each rollout worker asks of Ray at `per_cpu` workers a CPU: a whole CPU at
    1, else 1 / per_cpu cut down to the 0.0001 Ray counts in (so 27 of 2/3 fit on 18)."""
    return 1.0 if per_cpu <= 1 else int(1e4 / per_cpu) / 1e4


def groups(workers: int, at_most: int) -> list[int]:
    """`workers` of one node cut into as few groups of at most `at_most` as can be, of
    sizes that differ by one at most: 64 -> [32, 32], 40 -> [20, 20], 18 -> [18]."""
    if workers <= 0:
        return []
    count = -(-workers // at_most)
    return [workers // count + (1 if k < workers % count else 0) for k in range(count)]


# The cluster pool's (pool/cluster_pool.py) cadences and leaders, here for the model (scaling/model.py) too:
# A leader hands its workers their matches one Ray call at a time (about 0.5-1 ms each),
# but the next batch's calls go out while this one plays, so they are off the batch's
# start. A node of up to 64 workers has one leader, whose sum is then the batch's whole
# total (no sums to meet: the reducer rounds it as it comes); more get several.
LEADER_WORKERS = 64
REPORT_SECONDS = 0.5  # how often a leader tells the queue which matches it has finished ...
REPORTING_LEADERS = 16  # ... up to this many leaders; with more, each tells it less often (report_seconds)
# how often the driver reads the queue's reports (and whenever a leader's run ends): for live
# progress only, as the last read, after the sum, brings the rest
POLL_SECONDS = 1.0
GUIDED = 4  # a node's request to the cluster's queue brings at least 1/GUIDED of its share of what is left


def report_seconds(leaders: int) -> float:
    """How often each of a cluster's `leaders` tells the queue which matches it has
    finished, between a batch's sums: every REPORT_SECONDS up to REPORTING_LEADERS, then
    less often, so that the queue takes at most 32 of these reports a second, however
    many nodes (they feed the live progress only: a leader's last report of a batch goes
    before its sum, whatever the cadence). At 110 nodes they were most of the queue's
    CPU in the model."""
    return REPORT_SECONDS * max(1.0, leaders / REPORTING_LEADERS)


def request_size(free: int, left: int, size: int, workers: int) -> int:
    """How many matches a request of a node (a leader of `size` workers, `free` of
    them free) brings from the cluster's queue, `left` being left for all `workers`:
    one per free worker (two while at least two per worker are left), or, if more,
    a GUIDED-th of the node's share of what is left (guided self-scheduling: few
    requests while many matches are left, one per match at the end)."""
    guided = -(-left * size // (GUIDED * max(1, workers)))
    return min(max(2 * free if left >= 2 * workers else free, guided), left)


def requests(durations: list[float], sizes: list[int], pause: float = 0.0, answer: float = 0.002) -> int:
    """How many requests the nodes' leaders (of `sizes` workers) make to the queue for
    one batch played alone (pool/queue.py): one whenever a leader has a free worker
    with nothing to play and no request out, answered `answer` seconds later for the
    workers free by then, while the queue has matches; and a last, empty one each
    (without a lag a leader does not ask again after one)."""
    workers, left, todo = sum(sizes), len(durations), deque(durations)
    local: list[deque[float]] = [deque() for _ in sizes]
    free = list(sizes)  # each leader's workers with nothing to play
    asking = [False] * len(sizes)
    told_empty = [False] * len(sizes)
    events: list[tuple[float, int, bool]] = []  # (when, leader, whether it is an answer, else a worker freeing up)
    count = 0

    def step(leader: int, now: float) -> None:
        nonlocal count
        while free[leader] and local[leader]:  # its free workers start what the node holds
            free[leader] -= 1
            heapq.heappush(events, (now + local[leader].popleft() + pause, leader, False))
        if free[leader] and not asking[leader] and left:
            asking[leader], count = True, count + 1
            heapq.heappush(events, (now + answer, leader, True))

    for leader in range(len(sizes)):
        step(leader, 0.0)
    while events:
        now, leader, is_answer = heapq.heappop(events)
        if is_answer:
            asking[leader] = False
            given = request_size(free[leader], left, sizes[leader], workers)
            left -= given
            local[leader].extend(todo.popleft() for _ in range(given))
            told_empty[leader] = told_empty[leader] or not given
        else:
            free[leader] += 1
        step(leader, now)
    return count + told_empty.count(False)


def first_free(durations: list[float], workers: int, pause: float = 0.0) -> float:
    """pgpong's schedule: the matches in episode order, each to the first free worker
    (a worker waits `pause` between two matches). When the last one ends."""
    free = [0.0] * workers
    for duration in durations:
        heapq.heappush(free, heapq.heappop(free) + duration + pause)
    return max(free)


def best_whole_matches(durations: list[float], workers: int) -> float:
    """What a clairvoyant schedule of whole matches would take (longest first, each to
    the first free worker): matches cannot be split, so with fewer than two per worker
    it stays above the lower bound."""
    return first_free(sorted(durations, reverse=True), workers)


def lower_bound(durations: list[float], workers: int) -> float:
    """No schedule can be faster: the longest match, or all the work shared evenly."""
    return max(max(durations), sum(durations) / workers)


def shared_cores(durations: list[float], cores: float) -> float:
    """When the last match ends if all start at once and `cores` are shared equally
    among those still playing (each of k advances at min(1, cores / k) of a core, as an
    operating system shares a node's cores): a what-if, docs/scaling/processor_sharing.py."""
    now = done = 0.0
    lengths = sorted(durations)
    for i, length in enumerate(lengths):
        now += (length - done) / min(1.0, cores / (len(lengths) - i))
        done = length
    return now


def shared_first_free(durations: list[float], nodes: list[tuple[int, int]], pause: float = 0.0) -> float:
    """pgpong's schedule where a node's workers may outnumber its cores (--workers-per-cpu
    above 1): the matches in episode order, each to the first free worker (at the start,
    node after node, as the nodes' first requests to the queue fill them), the cores of a
    node shared equally by its matches in play (each of k on c cores advances at min(1, c/k)
    of a core, as the operating system shares them). `nodes`: (workers, cores) of each.
    When the last match ends; with no more workers than cores, first_free's answer. (Where
    two nodes free a worker at the same moment with a match still waiting, which takes it
    rests on the times' last bits: the makespan may then differ from a schedule in exact
    arithmetic by one match's placement.) One batch of shared_pipelined, with no step."""
    if not durations:
        return 0.0
    return shared_pipelined([list(durations)], nodes, pause, 0.0, 0)[0]


def pipelined(
    batches: list[list[float]], workers: int, pause: float, step: float, lag: int, share: float = 0.0
) -> list[float]:
    """When each batch's update is done, if batch k may start once update k - 1 - lag
    is (lag 0: after the update before it, as pgpong trains; lag 1: with the weights
    from before the last update, so two batches overlap); with lag 0 and a `share`
    (--lag-share), the batch's first matches (that share of them, rounded) may start
    once update k - 2 is. The matches go in order, batch by batch, each to the first
    free worker (a worker waits `pause` after each match); an update takes `step`
    after its batch's last match."""
    free = [0.0] * workers
    done: list[float] = []
    for k, durations in enumerate(batches):
        release = done[k - 1 - lag] if k - 1 - lag >= 0 else 0.0
        stale = round(share * len(durations))  # (with lag 1 these start no earlier than the rest)
        early = done[k - 2] if k >= 2 else 0.0
        last = release
        for i, duration in enumerate(durations):
            end = max(heapq.heappop(free), early if i < stale else release) + duration + pause
            heapq.heappush(free, end)
            last = max(last, end)
        done.append(max(last, done[-1] if done else 0.0) + step)  # the updates come one after another
    return done


class _SharedNodes:
    """Nodes whose matches in play share their cores equally (shared_first_free's
    rule), for an event simulation: each node's clock of the work its matches have had
    (`work`, as of `since`), its matches in play (the work at which each ends, and a
    tag), and a version that makes its older entries in the event heap stale once its
    rate changes."""

    def __init__(self, nodes: list[tuple[int, int]], events: list[tuple[float, int, int]]):
        if not any(w > 0 and c > 0 for w, c in nodes):
            raise ValueError(f"no node with workers and cores to play on: {nodes}")
        self.nodes, self.events = nodes, events
        self.work, self.since, self.version = [0.0] * len(nodes), [0.0] * len(nodes), [0] * len(nodes)
        self.ends: list[list[tuple[float, int]]] = [[] for _ in nodes]

    def free(self, n: int) -> int:
        workers, cores = self.nodes[n]
        return workers - len(self.ends[n]) if cores > 0 else 0

    def _rate(self, n: int) -> float:
        return min(1.0, self.nodes[n][1] / len(self.ends[n])) if self.ends[n] else 0.0

    def _advance(self, n: int, now: float) -> None:
        self.work[n] += (now - self.since[n]) * self._rate(n)
        self.since[n], self.version[n] = now, self.version[n] + 1

    def _next_end(self, n: int) -> None:
        if self.ends[n]:
            end = self.since[n] + (self.ends[n][0][0] - self.work[n]) / self._rate(n)
            heapq.heappush(self.events, (end, n, self.version[n]))

    def start(self, n: int, now: float, matches: list[tuple[float, int]]) -> None:
        """Node n starts these (length, tag) matches at `now`."""
        self._advance(n, now)
        for length, tag in matches:
            heapq.heappush(self.ends[n], (self.work[n] + length, tag))
        self._next_end(n)

    def end(self, n: int, now: float, seen: int) -> int | None:
        """Node n's event at `now`: the tag of the match that ends, or None if the event
        is stale (its rate changed since; a later one stands for it)."""
        if seen != self.version[n]:
            return None
        self._advance(n, now)
        _, tag = heapq.heappop(self.ends[n])
        self._next_end(n)
        return tag


def shared_pipelined(
    batches: list[list[float]], nodes: list[tuple[int, int]], pause: float, step: float, lag: int, share: float = 0.0
) -> list[float]:
    """pipelined() where a node's workers may outnumber its cores, shared as in
    shared_first_free: when each batch's update is done. The matches go in order, batch
    by batch, each to the first free worker once its batch may start (pipelined's rule
    for `lag` and `share`); workers that wait for a batch take its matches node after
    node when it may start."""
    events: list[tuple[float, int, int]] = []  # (time, node, its version); node -1: a batch may start
    cluster = _SharedNodes(nodes, events)
    todo = deque((k, i < round(share * len(ds)), d + pause) for k, ds in enumerate(batches) for i, d in enumerate(ds))
    left = [len(durations) for durations in batches]  # each batch's matches not yet over
    ended = [0.0] * len(batches)  # when each batch's last match ended
    done: list[float] = []  # when each update was done, in order (they come one after another)

    def may_start(now: float) -> bool:
        k, early = todo[0][:2]
        before = k - 2 if early else k - 1 - lag
        return before < 0 or (before < len(done) and done[before] <= now)

    def fill(now: float, which: Iterable[int]) -> None:
        for n in which:
            taken: list[tuple[float, int]] = []
            while todo and len(taken) < cluster.free(n) and may_start(now):
                k, _, length = todo.popleft()
                taken.append((length, k))
            if taken:
                cluster.start(n, now, taken)

    fill(0.0, range(len(nodes)))
    while events:
        now, n, seen = heapq.heappop(events)
        if n < 0:  # a batch may start: every node's free workers take its matches
            fill(now, range(len(nodes)))
            continue
        k = cluster.end(n, now, seen)
        if k is None:
            continue
        left[k] -= 1
        ended[k] = max(ended[k], now)
        while len(done) < len(batches) and left[len(done)] == 0:
            done.append(max(ended[len(done)], done[-1] if done else 0.0) + step)
            heapq.heappush(events, (done[-1], -1, 0))
        fill(now, (n,))  # (the other nodes' free workers wait for a batch: they took all they could)
    return done
