import { HydraPort, OPCODES } from '@hydra-engine/hydra-rpc';
import { afterEach, expect, it } from 'vitest';
import { requireOpcodes } from './lib/engine.js';

// The guard the CONFIGURE suites run first: a port that stops serving an opcode must fail them.
let port: HydraPort | undefined;
afterEach(async () => {
  await port?.close();
  port = undefined;
});

it('rejects, naming the opcode, when HELLO does not list it', async () => {
  port = new HydraPort({ handlers: { HELLO: () => ({ opcodes: [OPCODES.HELLO, OPCODES.STATUS] }) } });
  const { port: n } = await port.listen();
  await expect(requireOpcodes(n, 'STATUS', 'CONFIGURE')).rejects.toThrow(/does not list CONFIGURE$/);
});

it('resolves when HELLO lists every opcode asked for', async () => {
  port = new HydraPort({
    handlers: { HELLO: () => ({ opcodes: [OPCODES.HELLO, OPCODES.STATUS, OPCODES.CONFIGURE] }) },
  });
  const { port: n } = await port.listen();
  await expect(requireOpcodes(n, 'STATUS', 'CONFIGURE')).resolves.toBeUndefined();
});
