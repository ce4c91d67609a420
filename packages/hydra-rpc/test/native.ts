import { existsSync } from 'node:fs';
import type { NativeFdOps } from '../src/index.js';

// The ggml-RPC half of the port needs native-ggml's addon (MSG_PEEK, dup, serveRpcFd). hydra-rpc
// never imports it; these tests load the sibling package's build by path.
export interface NativeGgml extends NativeFdOps {
  addonCandidates(): string[];
  probeRpcServer(
    endpoint: string,
    timeoutMs?: number,
  ): Promise<{ major: number; minor: number; patch: number }>;
}

/**
 * native-ggml's build and its rpc-host entry, or undefined until it is built. native-ggml is a
 * devDependency, so turbo builds it before these tests; in CI its absence throws (a failure, not
 * a skip).
 */
export async function loadNativeGgml(): Promise<{ native: NativeGgml; rpcHostPath: string } | undefined> {
  const loaded = await load();
  if (loaded === undefined && process.env.CI) {
    throw new Error('the native-ggml addon is not built: the merged port cannot be tested end to end');
  }
  return loaded;
}

async function load(): Promise<{ native: NativeGgml; rpcHostPath: string } | undefined> {
  const entry = new URL('../../native-ggml/dist/index.js', import.meta.url);
  if (!existsSync(entry)) return undefined;
  try {
    const native = (await import(entry.href)) as NativeGgml;
    const host = (await import(new URL('../../native-ggml/dist/rpc-host.js', import.meta.url).href)) as {
      rpcHostPath: string;
    };
    return native.addonCandidates().some((candidate) => existsSync(candidate))
      ? { native, rpcHostPath: host.rpcHostPath }
      : undefined;
  } catch {
    return undefined;
  }
}
