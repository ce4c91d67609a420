import type { SamplerParams } from '@hydra-engine/native-ggml';
import type { ModelFacts } from '@hydra-engine/resolver';
import type { FailoverDecision } from '../combine/failover.js';
import type { TokenProb } from './output.js';

/** Lifecycle states, as `/health` and Hydra STATUS report them. */
export type EngineState = 'empty' | 'loading' | 'ready' | 'draining' | 'error';

export type FinishReason = 'stop' | 'length' | 'cancelled';

/** Per-request (T1) settings of one generation, already validated. */
export interface GenerationParams {
  /** Upper bound on generated tokens; clipped to the room left in the slot's context. */
  maxTokens: number;
  stop: string[];
  sampler: SamplerParams;
  ignoreEos: boolean;
  /** llama-server's n_keep for a context shift (ctx_shift on); undefined: the n_keep in force. */
  nKeep?: number;
  /**
   * Report each generated token's probability and its `n` most likely alternatives (llama-server's
   * n_probs; after the sampler chain with `postSampling`). Such a request is never speculated.
   */
  probs?: { n: number; postSampling: boolean };
}

export interface GenerationResult {
  text: string;
  /** Prompt tokens whose KV came from the slot's cache (`cachePrompt`). */
  cachedTokens: number;
  tokens: number[];
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  /** The configuration epoch that served the request. */
  epoch: number;
  /** The slot that ran it. */
  slot: number;
  /** Milliseconds from submission until it got its slot (the queue wait). */
  queueMs: number;
  /** With GenerationParams.probs: the tokens whose text is in `text` (a stop string's are not). */
  probs?: TokenProb[];
}

export interface SubmitOptions {
  /**
   * Text as it becomes final (stop strings are never split across or leaked into it); with
   * GenerationParams.probs, the probabilities of the tokens that became final with it (then `text`
   * may be '' at the end: tokens with an empty piece).
   */
  onText?: (text: string, probs?: TokenProb[]) => void;
  /** Each generated token id as it is sampled (before stop strings cut the text). */
  onToken?: (token: number) => void;
  /** Aborting frees the slot at the next step; the promise resolves with `finishReason: 'cancelled'`. */
  signal?: AbortSignal;
  /** Run in this slot (waits for it); default: any free slot. */
  slot?: number;
  /**
   * Keep the slot's KV after the request and reuse the longest common token prefix of the slot's
   * cache for this prompt (llama.cpp server's `cache_prompt`); see `Engine.getSlotState`.
   */
  cachePrompt?: boolean;
  /**
   * Requests submitted with the same object and the same prompt share its KV (an `n > 1` request's
   * choices): the first prefills, each later one waits until that is done and copies the sequence
   * (then decodes only the prompt's last token). A recurrent or hybrid memory cannot drop the copy's
   * generated tail: those prefill alone.
   */
  promptGroup?: object;
}

/** Expert placement of an MoE model (protocol.md SET_EXPERT_MODE). */
export type ExpertMode = 'solo' | 'combined';

/** Counters for `/metrics`. */
export interface EngineCounters {
  promptTokens: number;
  generatedTokens: number;
  requests: Record<FinishReason | 'error', number>;
  decodeSteps: number;
  /** Steps queued before the previous one ended (the pipelined loop). */
  decodeStepsAhead: number;
  /** Entries of steps queued ahead that were dropped: their request had ended meanwhile. */
  decodeEntriesWasted: number;
  decodeSeconds: number;
  /** Decode entries that fed a part of a prompt (chunked prefill: a long prompt takes several). */
  promptChunks: number;
  /** Prompt checkpoints taken (recurrent or hybrid memory), and those restored to reuse a prefix. */
  checkpointsCreated: number;
  checkpointRestores: number;
  /** Speculative decoding: tokens guessed, and those of them the model confirmed. */
  specDrafted: number;
  specAccepted: number;
  /** The same two by speculative.types (ngram_simple, the other n-gram types, draft_simple). */
  specByType: { drafted: Record<string, number>; accepted: Record<string, number> };
  loadSeconds: number;
  rejectedQueueFull: number;
  /** T2/T3 rebuilds that failed (at once or deferred), by what they rebuilt. */
  rebuildFailures: { context: number; model: number };
}

/** Why and since when the engine serves less than it was configured for (a lost peer). */
export interface Degraded {
  reason: string;
  since: string;
  peers: string[];
  /** The failover taken (combine/failover.ts); absent before the decision is made. */
  failover?: FailoverDecision;
  /** What the lost COMBINE still holds in this process, and why it cannot be freed. */
  held?: { what: string[]; why: string };
  /** The automatic rejoin (combine/rejoin.ts): on or off, probes so far, the last probe's answer. */
  rejoin?: {
    enabled: boolean;
    probes: number;
    next_probe_ms?: number;
    last_error?: string;
    gave_up?: boolean;
  };
}

/**
 * A COMBINE peer loss, as the runtime reports it to the one owner of the configuration (the
 * controller) through {@link PeerEvents.lost}. The runtime has marked the peers lost and, right
 * after the answer, does what it must at once whatever the answer (`atOnce`): the model and context
 * on the lost peer can never serve or be freed again.
 */
export interface PeerLossEvent {
  /** The peers dropped: every configured one (the model used all of them: one loss breaks its graph). */
  peers: string[];
  reason: string;
  /** What saw the loss: the watchdog (or a caller of `Engine.failOver`), a model load, a context rebuild. */
  cause: 'watchdog' | 'load' | 'context';
  /** What the runtime does at once, before it builds what the answer asks. */
  atOnce: {
    /** Running requests ended with `HYDRA_ERR_PEER_LOST`. */
    endRequests: number;
    /** The model and context left referenced, never freed (their buffers live on the lost peer too). */
    abandon: string[];
    /** The MoE standby (local devices only) is freed. */
    freeStandby: boolean;
  };
  /** Facts of the model that served (the failover planner's input); undefined when none was loaded. */
  facts: ModelFacts | undefined;
}

/** What the runtime builds after a peer loss: the controller's answer to a {@link PeerLossEvent}. */
export interface FailoverAnswer {
  /** `solo`/`offload`: reload the model in force without the peers (the layers say how); `none`: nothing. */
  build: 'solo' | 'offload' | 'none';
  /** The planner's figures the answer was taken on (STATUS `degraded.failover`); undefined without model facts. */
  decision: FailoverDecision | undefined;
  /** Probe the lost peers and offer {@link PeerEvents.rejoined} when they answer (`peer_rejoin`). */
  rejoin: boolean;
}

/**
 * The runtime's peer events and their one listener, the owner of the configuration layers and
 * the deferral policy: the runtime never writes the layers itself.
 */
export interface PeerEvents {
  /** A peer loss (called once per loss, before the runtime acts): update the layers, answer what to build. */
  lost(event: PeerLossEvent): FailoverAnswer;
  /** The lost peers answer again and are registered: put their COMBINE configuration back in force (the runtime loads it next). */
  rejoined(event: { peers: string[] }): void;
  /** The rejoin's load failed: put the failover configuration back (the runtime loads it next). */
  rejoinFailed(event: { peers: string[]; error: Error }): void;
}

export interface Logger {
  info(msg: string): void;
  warn(msg: string): void;
}

export function newCounters(): EngineCounters {
  return {
    promptTokens: 0,
    generatedTokens: 0,
    requests: { stop: 0, length: 0, cancelled: 0, error: 0 },
    decodeSteps: 0,
    decodeStepsAhead: 0,
    decodeEntriesWasted: 0,
    decodeSeconds: 0,
    promptChunks: 0,
    checkpointsCreated: 0,
    checkpointRestores: 0,
    specDrafted: 0,
    specAccepted: 0,
    specByType: {
      drafted: {
        ngram_simple: 0,
        ngram_map_k: 0,
        ngram_map_k4v: 0,
        ngram_mod: 0,
        ngram_cache: 0,
        draft_simple: 0,
      },
      accepted: {
        ngram_simple: 0,
        ngram_map_k: 0,
        ngram_map_k4v: 0,
        ngram_mod: 0,
        ngram_cache: 0,
        draft_simple: 0,
      },
    },
    loadSeconds: 0,
    rejectedQueueFull: 0,
    rebuildFailures: { context: 0, model: 0 },
  };
}
