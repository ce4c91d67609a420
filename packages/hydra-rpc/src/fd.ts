import type { Socket } from 'node:net';
import { HydraError } from './errors.js';

/**
 * The OS file descriptor of an accepted TCP socket. `socket._handle.fd` is internal to Node: it was
 * checked on Node 20 (the pinned major) and a test pins it, so a Node upgrade that moves it fails
 * loudly here instead of handing a wrong fd to native code.
 */
export function socketFd(socket: Socket): number {
  const handle = (socket as unknown as { _handle?: { fd?: unknown } | null })._handle;
  const fd = handle?.fd;
  if (typeof fd !== 'number' || !Number.isInteger(fd) || fd < 0) {
    throw new HydraError(
      'HYDRA_ERR_INTERNAL',
      `socket fd unavailable (socket._handle.fd is ${String(fd)} on Node ${process.versions.node})`,
    );
  }
  return fd;
}

/**
 * Node's handle of an accepted TCP socket (`socket._handle`, internal like its fd), which
 * `child.send(message, handle)` passes to a child process as a raw handle that does not read:
 * the bytes the native peek left unread stay unread for the host.
 */
export function socketHandle(socket: Socket): object {
  const handle = (socket as unknown as { _handle?: { fd?: unknown } | null })._handle;
  if (handle === null || handle === undefined || typeof handle !== 'object') {
    throw new HydraError('HYDRA_ERR_INTERNAL', 'socket handle unavailable (the socket is closed)');
  }
  return handle;
}
