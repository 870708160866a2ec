"""An aiohttp app served from its own thread on 127.0.0.1 (the controller's poll tests' fake engines)."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web


class ThreadedAiohttpServer:
    """Serves :meth:`make_app`'s application on 127.0.0.1, a free port (``port``), from a daemon
    thread's event loop (``loop``); :meth:`close` stops it and cancels its handlers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    def make_app(self) -> web.Application:
        """The application to serve (subclasses)."""
        raise NotImplementedError

    async def _start(self) -> int:
        self.runner = web.AppRunner(self.make_app(), access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return site._server.sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop the server, cancel its pending handlers, end the thread."""
        async def stop() -> None:
            await self.runner.cleanup()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            await asyncio.sleep(0.05)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
