import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { resolve } from 'node:path';
import { writeSyntheticModel } from '@hydra-engine/native-ggml/synth';
import { HydraError } from './errors.js';
import { freeLoopbackPort } from './ports.js';
import { selfCommand } from './self.js';
import { sseData } from './sse.js';

type Io = { stdout: { write(t: string): unknown }; stderr: { write(t: string): unknown } };

interface Child {
  name: string;
  proc: ChildProcess;
  lines: string[];
  waitFor(re: RegExp, timeoutMs: number): Promise<RegExpExecArray>;
}

function startChild(name: string, args: string[], io: Io): Child {
  const self = selfCommand();
  // Text log lines: the demo shows them to a person (a pipe would get JSON).
  const proc = spawn(self.file, [...self.args, ...args, '--log-format', 'text'], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines: string[] = [];
  const waiters: { re: RegExp; resolve(m: RegExpExecArray): void }[] = [];
  let buf = '';
  const onData = (d: Buffer) => {
    buf += d.toString();
    let at = buf.indexOf('\n');
    while (at >= 0) {
      const line = buf.slice(0, at);
      buf = buf.slice(at + 1);
      at = buf.indexOf('\n');
      lines.push(line);
      io.stderr.write(`  [${name}] ${line}\n`);
      for (const w of [...waiters]) {
        const m = w.re.exec(line);
        if (m) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(m);
        }
      }
    }
  };
  proc.stdout!.on('data', onData);
  proc.stderr!.on('data', onData);
  return {
    name,
    proc,
    lines,
    waitFor(re, timeoutMs) {
      for (const line of lines) {
        const m = re.exec(line);
        if (m) return Promise.resolve(m);
      }
      return new Promise((res, rej) => {
        const timer = setTimeout(
          () =>
            rej(new HydraError('HYDRA_ERR_INTERNAL', `${name}: no line matching ${re} in ${timeoutMs} ms`)),
          timeoutMs,
        );
        proc.once('exit', (code) => rej(new HydraError('HYDRA_ERR_INTERNAL', `${name} exited with ${code}`)));
        waiters.push({
          re,
          resolve: (m) => {
            clearTimeout(timer);
            res(m);
          },
        });
      });
    },
  };
}

async function stop(child: Child): Promise<number | null> {
  if (child.proc.exitCode !== null) return child.proc.exitCode;
  const exited = new Promise<number | null>((res) => child.proc.once('exit', (code) => res(code)));
  child.proc.kill('SIGTERM');
  const timer = setTimeout(() => child.proc.kill('SIGKILL'), 10_000);
  const code = await exited;
  clearTimeout(timer);
  return code;
}

/**
 * The quick start: writes the tiny synthetic model if missing, starts a peer engine (devices served
 * on its merged port) and a head engine that loads the model split across both, streams one chat
 * completion, prints tokens/s and the layer placement, and shuts both down.
 */
export async function runDemo(argv: readonly string[], io: Io): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    io.stdout.write(
      'hydra-engine demo [--models DIR]\n\nStarts two engines on loopback (a peer and a head over ggml-RPC) with the tiny\n' +
        'synthetic model (written to DIR, default ./models), shows the split and a completion, and stops them.\n',
    );
    return;
  }
  const extra = argv[0] === '--models' && argv[1] ? argv.slice(2) : argv;
  if (extra.length > 0)
    throw new HydraError('HYDRA_ERR_BAD_ARGUMENT', `demo takes only --models DIR, got ${extra.join(' ')}`, {
      keys: [extra[0]!],
    });
  const dir = resolve(argv[0] === '--models' && argv[1] ? argv[1] : 'models');
  mkdirSync(dir, { recursive: true });
  const model = resolve(dir, 'tiny-q8_0.gguf');
  if (!existsSync(model)) {
    const r = await writeSyntheticModel({ arch: 'llama', shape: 'tiny', quant: 'q8_0', seed: 0, out: model });
    io.stdout.write(`demo: wrote the tiny synthetic model ${model} (${(r.bytes / 1e6).toFixed(1)} MB)\n`);
  } else io.stdout.write(`demo: using ${model}\n`);
  const children: Child[] = [];
  try {
    // --rpc-port 0 means off, so the peer gets a port that was free a moment ago.
    const free = await freeLoopbackPort();
    const peer = startChild('peer', ['--port', '0', '--rpc-port', String(free), '--progress', 'lines'], io);
    children.push(peer);
    const peerRpc = (await peer.waitFor(/merged ggml-RPC\/Hydra port on (\S+):(\d+)/, 30_000))[2]!;
    const peerHttp = (await peer.waitFor(/HTTP on (http:\/\/\S+)/, 5_000))[1]!;
    // Tiny has 4 layers; n_gpu_layers counts the output layer, so 3 puts layers 2-3 and the output on RPC0.
    const head = startChild(
      'head',
      [
        '--port',
        '0',
        '-m',
        model,
        '--rpc',
        `127.0.0.1:${peerRpc}`,
        '--device',
        'RPC0',
        '-ngl',
        '3',
        '-c',
        '1024',
        '--progress',
        'lines',
      ],
      io,
    );
    children.push(head);
    const headHttp = (await head.waitFor(/HTTP on (http:\/\/\S+)/, 30_000))[1]!;
    await head.waitFor(/model ready/, 120_000);
    io.stdout.write('\ndemo: chat completion, streamed from the head engine:\n\n');
    const t0 = performance.now();
    const res = await fetch(`${headHttp}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        messages: [{ role: 'user', content: 'Tell me about the world.' }],
        max_tokens: 64,
        temperature: 0,
        stream: true,
        stream_options: { include_usage: true },
      }),
    });
    if (!res.ok || !res.body)
      throw new HydraError('HYDRA_ERR_INTERNAL', `head answered ${res.status}: ${await res.text()}`);
    let first = -1;
    let usage: { completion_tokens: number; prompt_tokens: number } | undefined;
    for await (const data of sseData(res.body as unknown as AsyncIterable<Uint8Array>)) {
      const obj = JSON.parse(data) as { usage?: typeof usage; choices: { delta?: { content?: string } }[] };
      if (obj.usage) usage = obj.usage;
      const text = obj.choices[0]?.delta?.content;
      if (text) {
        if (first < 0) first = performance.now();
        io.stdout.write(text);
      }
    }
    const end = performance.now();
    const n = usage?.completion_tokens ?? 0;
    io.stdout.write(
      '\n\ndemo: the text is noise, as expected: the tiny model has random weights (a real GGUF answers in words)\n' +
        `demo: ${n} tokens in ${((end - t0) / 1000).toFixed(2)} s; ${((n - 1) / Math.max((end - first) / 1000, 1e-6)).toFixed(1)} tokens/s ` +
        `after the first token (time to first token ${(first - t0).toFixed(0)} ms, prompt ${usage?.prompt_tokens ?? 0} tokens)\n`,
    );
    const health = (await (await fetch(`${headHttp}/health`)).json()) as {
      placement?: { device: string; first: number; last: number; output: boolean }[];
    };
    io.stdout.write('demo: where the layers ran:\n');
    for (const r of health.placement ?? []) {
      const where = r.device.startsWith('RPC')
        ? `peer engine at 127.0.0.1:${peerRpc} via ggml-RPC`
        : 'head engine';
      io.stdout.write(
        `  layers ${r.first}-${r.last}${r.output ? ' + output' : ''}: ${r.device} (${where})\n`,
      );
    }
    // The peer's hosts report a running session's socket counters once a second: wait for the
    // report that covers the completion, so the figures are the bytes that crossed the wire.
    await new Promise((r) => setTimeout(r, 1200));
    const metrics = await (await fetch(`${peerHttp}/metrics`)).text();
    const rpcLines = metrics
      .split('\n')
      .filter((l) => /^hydra_rpc_(sessions_active|bytes_in_total|bytes_out_total)/.test(l));
    io.stdout.write(`demo: peer's merged port: ${rpcLines.join(', ')}\n`);
  } finally {
    for (const child of children.reverse()) {
      const code = await stop(child);
      io.stdout.write(`demo: ${child.name} engine stopped (exit ${code})\n`);
    }
  }
}
