import { createServer, type Server } from 'node:http';
import { type AddressInfo, connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { readJsonObject } from '../src/body.js';

// The one JSON-object reader of the control routes, over a real loopback socket.
let server: Server;
let port = 0;
beforeAll(async () => {
  server = createServer((req, res) => {
    readJsonObject(req, 64, 300).then(
      (body) => res.end(JSON.stringify({ body })),
      (err) => res.end(JSON.stringify({ code: err.code })),
    );
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

// Raw HTTP/1.1 over a socket, so a declared length can differ from what is sent.
function post(body: string, declared = Buffer.byteLength(body)): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const sock = connect(port, '127.0.0.1');
    let text = '';
    sock.on('data', (d) => {
      text += d;
    });
    sock.on('error', reject);
    sock.on('close', () => {
      const json = text.slice(text.indexOf('\r\n\r\n') + 4);
      try {
        resolve(JSON.parse(json));
      } catch {
        reject(new Error(`not a JSON answer: ${JSON.stringify(text)}`));
      }
    });
    sock.write(
      `POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: ${declared}\r\n\r\n${body}`,
    );
  });
}

describe('readJsonObject', () => {
  it('reads an object; an empty body is {}', async () => {
    expect(await post('{"a":1}')).toEqual({ body: { a: 1 } });
    expect(await post('')).toEqual({ body: {} });
    expect(await post('  \n')).toEqual({ body: {} });
  });

  it('refuses bad JSON, a non-object, a body over the cap (sent or declared) and a late one', async () => {
    expect(await post('{"a":')).toEqual({ code: 'HYDRA_ERR_BAD_JSON' });
    expect(await post('[1]')).toEqual({ code: 'HYDRA_ERR_BAD_REQUEST' });
    expect(await post('null')).toEqual({ code: 'HYDRA_ERR_BAD_REQUEST' });
    expect(await post(`{"a":"${'x'.repeat(100)}"}`)).toEqual({ code: 'HYDRA_ERR_BODY_TOO_LARGE' });
    expect(await post('{}', 1000)).toEqual({ code: 'HYDRA_ERR_BODY_TOO_LARGE' });
    expect(await post('{', 10)).toEqual({ code: 'HYDRA_ERR_REQUEST_TIMEOUT' });
  });
});
