import { readFileSync } from 'node:fs';
import { tableCodes } from '@hydra-engine/errors';
import { OPCODES, ERROR_CODES as RPC_CODES } from '@hydra-engine/hydra-rpc';
import { describe, expect, it } from 'vitest';
import { ERROR_CODES } from '../src/errors.js';

// docs/protocol.md is the contract other teams code against: its tables must be the code's.
const doc = readFileSync(new URL('../../../docs/protocol.md', import.meta.url), 'utf8');
const rpcReadme = readFileSync(new URL('../../../packages/hydra-rpc/README.md', import.meta.url), 'utf8');

function section(title: string): string {
  const at = doc.indexOf(`\n## ${title}\n`);
  expect(at, `protocol.md has a "## ${title}" section`).toBeGreaterThan(0);
  const end = doc.indexOf('\n## ', at + 1);
  return doc.slice(at, end < 0 ? undefined : end);
}

// Engine codes that only the HTTP edge or the CLI answer: never in a Hydra reply.
const HTTP_OR_CLI_ONLY = [
  'HYDRA_ERR_CONFIG_INVALID',
  'HYDRA_ERR_BAD_JSON',
  'HYDRA_ERR_BODY_TOO_LARGE',
  'HYDRA_ERR_REQUEST_TIMEOUT',
  'HYDRA_ERR_QUEUE_FULL',
  'HYDRA_ERR_PROMPT_TOO_LONG',
  'HYDRA_ERR_PROMPT_TOO_LARGE',
  'HYDRA_ERR_TOO_MANY_MESSAGES',
  'HYDRA_ERR_UNAUTHORIZED',
  'HYDRA_ERR_FORBIDDEN',
  'HYDRA_ERR_NOT_FOUND',
  'HYDRA_ERR_METHOD_NOT_ALLOWED',
  'HYDRA_ERR_CANCELLED',
  'HYDRA_ERR_DECODE_FAILED',
  'HYDRA_ERR_TOO_MANY_CONNECTIONS',
  'HYDRA_ERR_NOT_SUPPORTED',
  'HYDRA_ERR_NO_SLOT',
  'HYDRA_ERR_SHUTTING_DOWN',
];

describe('docs/protocol.md against the code', () => {
  it("lists hydra-rpc's opcode table exactly: every number and name, nothing else", () => {
    const rows = [...section('Opcodes').matchAll(/^\|\s*`0x([0-9A-Fa-f]{2})`\s*\|\s*([A-Z_]+)\s*\|/gm)].map(
      (m) => [m[2]!, Number.parseInt(m[1]!, 16)] as const,
    );
    expect(Object.fromEntries(rows)).toEqual(OPCODES);
    expect(rows.length).toBe(Object.keys(OPCODES).length);
  });

  it('lists every code a Hydra reply can carry, and only codes the code declares', () => {
    // hydra-rpc's wire codes (its README's "where" column says wire) and the engine's, but HTTP's.
    const wire = [...rpcReadme.matchAll(/^\|\s*`(HYDRA_ERR_[A-Z0-9_]+)`\s*\|([^|]*)\|/gm)]
      .filter((m) => m[2]!.includes('wire'))
      .map((m) => m[1]!);
    expect(wire.every((c) => (RPC_CODES as readonly string[]).includes(c))).toBe(true);
    for (const c of HTTP_OR_CLI_ONLY) expect(ERROR_CODES, c).toContain(c);
    const expected = new Set([...wire, ...ERROR_CODES.filter((c) => !HTTP_OR_CLI_ONLY.includes(c))]);
    const documented = tableCodes(section('Error codes'));
    expect({
      undocumented: [...expected].filter((c) => !documented.has(c)).sort(),
      undeclared: [...documented].filter((c) => !expected.has(c)).sort(),
    }).toEqual({ undocumented: [], undeclared: [] });
  });
});
