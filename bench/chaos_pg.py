"""Chaos at scale on PostgreSQL, full size: 4 real `runloop` workers, 200 tasks of 5
side-effect steps (emails to a real SMTP server, POSTs to a real HTTP receiver), a random
busy worker (one holding a task's lease) SIGKILLed about every half second and started again
while tasks are open; then a table of kills, effects, duplicates, questions by kind and the
most questions one kill left, and the checks of tests/support/chaos_scale.py.

    .venv/bin/python bench/chaos_pg.py [--workers 4] [--tasks 200] [--kill-every 0.5]
                                       [--min-kills 20] [--seed N]
                                       [--pg postgres://postgres@127.0.0.1:5432]

However fast the machine, a run sees at least --min-kills kills among work: until then the
tasks come in proportion to the kills so far. (Here 1000 steps take 9 s unkilled: a kill
every 2 s saw 3 or 4 of them, and kills at any worker, busy or not, mostly cut nothing.)

Database pgbench_chaos, dropped and made again at the start. Exits non-zero if any check
failed. The bounded version runs in the suite: tests/test_chaos_pg.py.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
from pathlib import Path

import pg

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--kill-every", type=float, default=0.5, help="seconds, give or take half")
    parser.add_argument("--min-kills", type=int, default=20, help="the last tasks wait for these")
    parser.add_argument("--seed", type=int, default=random.randrange(1 << 30))
    parser.add_argument("--timeout", type=float, default=900, help="seconds")
    parser.add_argument("--pg", default=pg.SERVER, help="the PostgreSQL server")
    options = parser.parse_args()
    print(f"before: {pg.load()}; seed {options.seed}", flush=True)
    (ROOT / "var").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="chaos-pg-", dir=ROOT / "var"))
    database = pg.fresh_database(options.pg, "pgbench_chaos")
    base = pg.setup_django(database, folder, LOOP_FILE_ROOT=str(folder / "files"))
    from tests.support.chaos_scale import run, worker_env
    from tests.support.chaos_sinks import HttpSink, SmtpSink

    with (
        SmtpSink(db_path=database, max_delay_ms=15) as smtp,
        HttpSink(db_path=database, max_delay_ms=15) as web,
    ):
        figures = run(
            worker_env(base, smtp, web),
            smtp,
            web,
            workers=options.workers,
            tasks=options.tasks,
            kill_every=options.kill_every,
            max_kills=sys.maxsize,
            min_kills=options.min_kills,
            seed=options.seed,
            log=folder / "workers.log",
            timeout=options.timeout,
        )
    print(f"after: {pg.load()}")
    print(figures.table())
    for problem in [*figures.violations, *figures.overlaps]:
        print("PROBLEM:", problem)
    failed = (
        figures.unfinished
        or figures.duplicates
        or figures.violations
        or figures.overlaps
        or figures.most_from_one_kill > 1
        or figures.steps_done != options.tasks * 5
        or figures.emails + figures.posts != options.tasks * 5
    )
    print("checks:", "FAILED" if failed else "all passed")
    if failed:
        print(f"the workers' log: {folder / 'workers.log'}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        f"reproduce: .venv/bin/python bench/chaos_pg.py --workers {options.workers} "
        f"--tasks {options.tasks} --kill-every {options.kill_every} "
        f"--min-kills {options.min_kills} --seed {options.seed}"
    )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
