"""A request that needs to write gets its turn while a worker writes back to back (SQLite:
one writer at a time, and SQLite's own busy handler retries ever more rarely; see
pippa_site/sqlite_turns). Counts, not timings: how many of the busy writer's transactions
commit while the request waits. The busy writer is a process of its own, as a worker is."""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.db import connection, transaction

from loop.models import Worker

from .conftest import ROOT, process_env, wait_for

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif("connection.vendor != 'sqlite'"),
]

BUSY = """
import sys, django
django.setup()
from django.db import connection, transaction
pk, n = int(sys.argv[1]), 0
WORK = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) SELECT COUNT(*) FROM c"
with connection.cursor() as cursor:
    while n < 200000:
        n += 1
        with transaction.atomic():  # a worker's batch: a few ms of work, back to back
            cursor.execute(WORK)
            cursor.execute("UPDATE loop_worker SET pid = %s WHERE id = %s", [n, pk])
"""


def test_a_waiting_writer_goes_before_a_writer_that_never_pauses() -> None:
    row = Worker.objects.create(label="busy", host="here", pid=0)
    busy = subprocess.Popen([sys.executable, "-c", BUSY, str(row.pk)], cwd=ROOT, env=process_env())
    try:
        wait_for(lambda: Worker.objects.get(pk=row.pk).pid > 200, timeout=60)
        rounds = []
        for _ in range(8):
            before = Worker.objects.get(pk=row.pk).pid
            with transaction.atomic():  # the request: a pause, an answer
                Worker.objects.filter(pk=row.pk).update(label="request")
                rounds.append(Worker.objects.get(pk=row.pk).pid - before)
    finally:
        busy.kill()
        busy.wait(30)
    print("the busy writer's commits while the request waited:", rounds)
    # Without turns the request often waits through dozens of the writer's commits (SQLite's
    # busy handler tries again after 1, 2, 5 … 100 ms, and finds the lock taken again); with
    # them, through the one in flight at most.
    assert max(rounds) <= 5, rounds
    assert connection.vendor == "sqlite"
