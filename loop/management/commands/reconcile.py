from __future__ import annotations

import getpass
from typing import Any

from loop.boot import reconcile
from loop.management.base import LoopCommand


class Command(LoopCommand):
    help = "Settle the effects and release the leases of dead workers (as a worker's boot does)."

    def handle(self, *args: Any, **options: Any) -> None:
        counts = reconcile(actor=f"cli:{getpass.getuser()}")
        self.stdout.write(
            f"dead workers {counts['workers']}, effects settled {counts['effects']}, "
            f"leases released {counts['leases']}"
        )
