"""An asyncio event loop on its own thread, for the server's gRPC handlers (why: `servicer`).
The learner, the committer and the caller of `serve` stay on their own threads and reach it
through `run` (handlers post back with ``call_soon_threadsafe``). No TensorFlow."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoopThread:
    """Runs an asyncio event loop on a daemon thread ``name`` until `close`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """From another thread: run ``coroutine`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread. Idempotent."""
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            try:
                self.run(cancel_rest(), timeout=10.0)
            finally:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self._thread.join()
        self.loop.close()
