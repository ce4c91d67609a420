// Peer side of COMBINE's "no weight transfer": the GGUF files this engine holds are indexed so
// that its merged port answers a head's ggml-RPC SET_TENSOR_HASH from local disk (see
// packages/native-ggml native/hydra_combine.cpp for why hashes rather than names).
import { rpcWeightsIndexAdd, type WeightsIndexAdded } from '@hydra-engine/native-ggml';
import type { Engine } from '../engine.js';

export interface WeightsIndexerOptions {
  engine: Engine;
  /** Files given with `--rpc-weights`, indexed at start. */
  files: readonly string[];
  log: (line: string) => void;
  /** How often the engine's own model is checked for a change (default 1000 ms). */
  pollMs?: number;
  /**
   * Called with each file as it is indexed here: the merged port's host processes, which serve the
   * sessions, keep an index of their own and are told through this.
   */
  onFile?: (file: string) => void;
}

/**
 * Indexes `--rpc-weights` files at once, then the engine's own model each time it changes (a
 * CONFIGURE or `/control/load_model` may load another): a peer that loaded the model the head is
 * about to load receives none of its large tensors. The check is a cheap unref'd timer rather
 * than a hook in the load path, so a failed index never fails a load. Returns a stop function.
 */
export function startWeightsIndexer(options: WeightsIndexerOptions): {
  ready: Promise<WeightsIndexAdded[]>;
  /** Indexes `files` now (CONFIGURE `rpc_weights`); rejects with the first file that cannot be. */
  index(files: readonly string[]): Promise<WeightsIndexAdded[]>;
  stop(): void;
} {
  const { engine, log } = options;
  // A file that cannot be indexed only costs the saving (the head then sends its bytes), so it is
  // logged, never fatal.
  const add = (file: string) => {
    try {
      options.onFile?.(file);
    } catch (err) {
      log(
        `hydra-engine: ggml-RPC weights index of ${file} not passed to the hosts: ${(err as Error).message}`,
      );
    }
    return rpcWeightsIndexAdd(file).then(
      (r): WeightsIndexAdded | undefined => {
        if (!r.already)
          log(
            `hydra-engine: ggml-RPC weights index: ${r.file} (${r.indexed} tensors, ${(r.bytes / 1e6).toFixed(0)} MB, ${r.ms.toFixed(0)} ms)`,
          );
        return r;
      },
      (err: Error) => {
        log(`hydra-engine: ggml-RPC weights index of ${file} failed: ${err.message}`);
        return undefined;
      },
    );
  };
  const ready = Promise.all(options.files.map(add)).then((all) =>
    all.filter((r): r is WeightsIndexAdded => r !== undefined),
  );
  let seen: string | undefined;
  let busy = false;
  const timer = setInterval(() => {
    const path = engine.state === 'ready' ? engine.modelPath : undefined;
    if (!path || path === seen || busy) return;
    busy = true;
    seen = path;
    void add(path).finally(() => {
      busy = false;
    });
  }, options.pollMs ?? 1000);
  timer.unref();
  const index = async (files: readonly string[]): Promise<WeightsIndexAdded[]> => {
    const out: WeightsIndexAdded[] = [];
    for (const file of files) {
      // The hosts are told first: the head's session runs in one of them.
      options.onFile?.(file);
      const r = await rpcWeightsIndexAdd(file);
      if (!r.already)
        log(
          `hydra-engine: ggml-RPC weights index (CONFIGURE): ${r.file} (${r.indexed} tensors, ${(r.bytes / 1e6).toFixed(0)} MB, ${r.ms.toFixed(0)} ms)`,
        );
      out.push(r);
    }
    return out;
  };
  return { ready, index, stop: () => clearInterval(timer) };
}
