import { fstatSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { expect, it } from 'vitest';
import { socketFd } from '../src/index.js';

// socket._handle.fd is a Node internal; the merged port depends on it, so the pinned major and the
// property's behaviour are checked here.
it('runs on the pinned Node major', () => {
  expect(process.versions.node.split('.')[0]).toBe('20');
});

it('reads the fd of a paused accepted socket, and refuses a destroyed one', async () => {
  const server = createServer({ pauseOnConnect: true });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  const accepted = new Promise<Socket>((resolve) => server.once('connection', resolve));
  const client = connect({ port, host: '127.0.0.1' });
  const socket = await accepted;
  try {
    const fd = socketFd(socket);
    expect(Number.isInteger(fd) && fd > 2).toBe(true);
    const stat = fstatSync(fd);
    expect(stat.isSocket()).toBe(true);
    socket.destroy();
    expect(() => socketFd(socket)).toThrow(expect.objectContaining({ code: 'HYDRA_ERR_INTERNAL' }));
  } finally {
    client.destroy();
    await new Promise((resolve) => server.close(resolve));
  }
});
