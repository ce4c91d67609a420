import { expect, it } from 'vitest';
import {
  BINARY_FIELDS,
  GGML_RPC_HELLO,
  HYDRA_OPCODE_MAX,
  HYDRA_OPCODE_MIN,
  isHydraOpcode,
  OPCODES,
  opcodeName,
} from '../src/index.js';

it('pins every opcode number of protocol.md', () => {
  expect(OPCODES).toEqual({
    HELLO: 0x30,
    STATUS: 0x31,
    CONFIGURE: 0x40,
    PLAN: 0x41,
    STATE_GET: 0x42,
    STATE_PUT: 0x43,
    SET_EXPERT_MODE: 0x44,
    SWAP_QUANT: 0x45,
    PIPELINE_ATTACH: 0x46,
  });
  expect(GGML_RPC_HELLO).toBe(0x0e);
  expect([HYDRA_OPCODE_MIN, HYDRA_OPCODE_MAX]).toEqual([0x30, 0x46]);
});

it('maps numbers to names and knows the Hydra range', () => {
  expect(opcodeName(0x42)).toBe('STATE_GET');
  expect(opcodeName(0x32)).toBeUndefined();
  expect([0x2f, 0x30, 0x3a, 0x46, 0x47, 0x0e].map(isHydraOpcode)).toEqual([
    false,
    true,
    true,
    true,
    false,
    false,
  ]);
  for (const op of Object.values(OPCODES)) expect(isHydraOpcode(op)).toBe(true);
});

it('names the binary fields of state transfer', () => {
  expect(BINARY_FIELDS.request).toEqual({ STATE_PUT: ['data'] });
  expect(BINARY_FIELDS.response).toEqual({ STATE_GET: ['data'] });
});
