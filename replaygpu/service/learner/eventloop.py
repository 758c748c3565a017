"""An asyncio event loop on its own thread, for the server's gRPC handlers.

The server answers every RPC on one event loop (grpc's asyncio server), so an open Append
stream costs a coroutine and its buffers, not a thread: hundreds of idle or busy actor streams
share the loop with the health and Info calls, which never wait for a free worker. The
learner, the committer and whoever called `serve` stay on their own threads and talk to the
loop through `run` (the handlers post back with ``call_soon_threadsafe``). No TensorFlow.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EventLoopThread:
    """Runs an asyncio event loop on a daemon thread until `close`.

    Args:
        name: the thread's name.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coroutine`` on the loop and wait for its result (from another thread)."""
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
