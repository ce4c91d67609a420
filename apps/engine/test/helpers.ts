import { tinyModel as kitTinyModel } from '@hydra-engine/test-kit';
import { parseServeArgs } from '../src/args.js';
import { type RunningEngine, startEngine } from '../src/serve.js';

export { CLI, runCli, waitFor } from '@hydra-engine/test-kit';

/** The fresh tiny synthetic model, in a folder of its own (variants may be written beside it). */
export const tinyModel = (): Promise<string> => kitTinyModel();

const quiet = { write: () => true };

/** An in-process engine on 127.0.0.1 with an ephemeral port, model loaded. */
export async function engineWith(flags: string[]): Promise<RunningEngine & { url: string }> {
  const running = await startEngine(
    parseServeArgs(['--port', '0', '--progress', 'off', '-t', '1', ...flags]),
    { log: quiet },
  );
  await running.loaded;
  return Object.assign(running, { url: `http://127.0.0.1:${running.httpPort}` });
}
