/**
 * The one place opcode numbers live (protocol.md, "Opcodes"). A test pins every number: they are a
 * wire contract with coordinators written in other languages.
 */
export const OPCODES = {
  HELLO: 0x30,
  STATUS: 0x31,
  CONFIGURE: 0x40,
  PLAN: 0x41,
  STATE_GET: 0x42,
  STATE_PUT: 0x43,
  SET_EXPERT_MODE: 0x44,
  SWAP_QUANT: 0x45,
  PIPELINE_ATTACH: 0x46,
} as const;

/** The name of a defined Hydra opcode. */
export type OpcodeName = keyof typeof OPCODES;

/** First byte of every ggml-RPC connection (`RPC_CMD_HELLO` of the pinned upstream). */
export const GGML_RPC_HELLO = 0x0e;
/** Lowest byte that opens a Hydra session. */
export const HYDRA_OPCODE_MIN = 0x30;
/** Highest byte that opens a Hydra session. */
export const HYDRA_OPCODE_MAX = 0x46;

const BY_NUMBER = new Map<number, OpcodeName>(
  Object.entries(OPCODES).map(([name, op]) => [op, name as OpcodeName]),
);

/** The name of `opcode`, or undefined when this protocol version does not define it. */
export function opcodeName(opcode: number): OpcodeName | undefined {
  return BY_NUMBER.get(opcode);
}

/** True when `byte` is in the Hydra range 0x30..0x46 (defined or not). */
export function isHydraOpcode(byte: number): boolean {
  return byte >= HYDRA_OPCODE_MIN && byte <= HYDRA_OPCODE_MAX;
}

/**
 * Fields carried as bytes: MessagePack `bin`, base64 strings in JSON. Listed per direction so both
 * ends can turn base64 back into bytes without guessing.
 */
export const BINARY_FIELDS: {
  readonly request: Readonly<Partial<Record<OpcodeName, readonly string[]>>>;
  readonly response: Readonly<Partial<Record<OpcodeName, readonly string[]>>>;
} = {
  request: { STATE_PUT: ['data'] },
  response: { STATE_GET: ['data'] },
};
