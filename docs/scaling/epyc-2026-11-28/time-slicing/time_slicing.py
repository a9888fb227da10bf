"""Does a node lose throughput when it runs more rollout workers than it has cores?
(docs/SCALING.md, "Sharing a node's cores instead".)

N processes, each playing real training matches as a rollout worker does
(pgpong.rollout.play_episode: the emulator, the network, the record and the
gradient), all started together and stopped after SECONDS; it prints, per N, the
env steps of the matches finished in that time over the seconds, and each process's
CPU seconds (an even share says the operating system shares the cores fairly).

    python time_slicing.py 2,3,4,6,8 30            # N values, seconds each
    python time_slicing.py 2,3,4 30 --max-episode-steps 400
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def play(index: int, start: float, seconds: float, max_steps: int | None, out: mp.Queue) -> None:
    from pgpong.envs import make_env
    from pgpong.policy import Params
    from pgpong.rollout import EpisodeId, play_episode

    env = make_env("ALE/Pong-v5", max_episode_steps=max_steps)
    weights = Params.initial(200, 0)  # a new policy: short, lost matches
    play_episode(env, weights, EpisodeId(0, 0, 10_000 + index), 0.99)  # compiled, warm
    while time.time() < start:
        time.sleep(0.001)
    steps = matches = 0
    cpu = time.process_time()
    while time.time() < start + seconds:
        steps += play_episode(env, weights, EpisodeId(1, index, matches), 0.99).stats().steps
        matches += 1
    out.put({"steps": steps, "matches": matches, "wall": time.time() - start, "cpu": time.process_time() - cpu})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("counts", help="process counts, comma-separated, run one after another")
    parser.add_argument("seconds", type=float)
    parser.add_argument("--max-episode-steps", type=int, default=None)
    args = parser.parse_args()
    for count in (int(x) for x in args.counts.split(",")):
        queue: mp.Queue = mp.Queue()
        start = time.time() + 8  # every process imported and warm by then
        processes = [
            mp.Process(target=play, args=(i, start, args.seconds, args.max_episode_steps, queue)) for i in range(count)
        ]
        for process in processes:
            process.start()
        results = [queue.get() for _ in processes]
        for process in processes:
            process.join()
        wall = max(r["wall"] for r in results)
        print(
            json.dumps(
                {
                    "processes": count,
                    "steps_per_s": round(sum(r["steps"] for r in results) / wall),
                    "wall_s": round(wall, 2),
                    "matches": sum(r["matches"] for r in results),
                    "cpu_s": [round(r["cpu"], 1) for r in results],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
