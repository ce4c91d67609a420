// Head side of "no weight transfer" at run time: before a COMBINE load, each peer that is a Hydra
// engine is told (CONFIGURE `rpc_weights`) which GGUF the head is about to load, so it indexes that
// file and answers the head's SET_TENSOR_HASH from its own disk instead of receiving the tensors.
// A peer that is not a Hydra engine (upstream's rpc-server leaves the connection unaccepted while
// the head's session is open, or closes one whose first byte is not its HELLO; the Hydra HELLO is
// given 1 s), does not admit the head to its control plane, or has no such file, only costs
// the saving: the load sends the bytes as before.
import { HydraClient } from '@hydra-engine/hydra-rpc';

export interface PeerWeightsResult {
  peer: string;
  /** Tensors the peer indexed from the file now; undefined when it did not. */
  tensors?: number;
  /** The peer had indexed the file before. */
  already?: boolean;
  /** Why the peer was not told, or refused. */
  error?: string;
}

/** Tells every peer in `peers` to index `file` (in parallel); never rejects. */
export async function tellPeersWeights(
  peers: readonly string[],
  file: string,
  options: { connectTimeoutMs?: number; helloTimeoutMs?: number; timeoutMs?: number } = {},
): Promise<PeerWeightsResult[]> {
  return Promise.all(
    peers.map(async (peer): Promise<PeerWeightsResult> => {
      const m = /^\[?(.+?)\]?:(\d+)$/.exec(peer);
      if (!m) return { peer, error: 'not host:port' };
      let client: HydraClient | undefined;
      try {
        client = await HydraClient.connect({
          host: m[1]!,
          port: Number(m[2]),
          connectTimeoutMs: options.connectTimeoutMs ?? 2000,
          // Indexing hashes the file's large tensors: about 1 s per GB read.
          timeoutMs: options.timeoutMs ?? 300_000,
        });
        // A Hydra engine answers HELLO at once (its port serves connections side by side); a
        // stock server with the head's session open leaves this connection unaccepted.
        const hello = await client.hello({}, { timeoutMs: options.helloTimeoutMs ?? 1000 });
        if (hello.engine?.name !== 'hydra-engine')
          return { peer, error: `not a Hydra engine (${hello.engine?.name})` };
        const r = (await client.configure({ rpc_weights: [file] })) as unknown as {
          rpc_weights_indexed?: { tensors: number; already: boolean }[];
        };
        const one = r.rpc_weights_indexed?.[0];
        return { peer, tensors: one?.tensors ?? 0, already: one?.already === true };
      } catch (err) {
        const e = err as Error & { code?: string };
        return { peer, error: e.code ? `${e.code}: ${e.message}` : e.message };
      } finally {
        await client?.close().catch(() => undefined);
      }
    }),
  );
}
