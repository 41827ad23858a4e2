"""Reading a test channel to its end as events, for the source tests."""

from slashrt._buffer import Control


async def read_all(receiver, dtype, into: list, on_buffer=None) -> None:
    """Append ("records", array), ("watermark", w) and ("barrier", n) to `into` until the
    channel ends; `on_buffer(k)` is called after the k-th data buffer was taken (its sender is
    then in the middle of its input)."""
    buffers = 0
    while True:
        await receiver.wait_readable()
        buffer = receiver.poll()
        if buffer is None:
            continue
        if buffer.is_control:
            ctype, value, _ = buffer.control()
            receiver.release()
            if ctype is Control.END_OF_STREAM:
                return
            into.append(("barrier" if ctype is Control.BARRIER else "watermark", value))
            continue
        into.append(("records", buffer.records(dtype).copy()))
        receiver.release()
        buffers += 1
        if on_buffer is not None:
            on_buffer(buffers)
