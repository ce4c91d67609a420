import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect, it } from 'vitest';

const patchesDir = fileURLToPath(new URL('../patches/', import.meta.url));
const BUDGET_LINES = 75;
const BUDGET_FUNCTIONS = 4;

/** Added lines and the upstream functions they create or change, across every patch. */
export function patchFootprint(patches: string[]): { added: number; functions: Set<string> } {
  let added = 0;
  const functions = new Set<string>();
  for (const text of patches) {
    let context = '';
    let file = '';
    let inNew = false;
    for (const line of text.split('\n')) {
      if (line.startsWith('+++ ')) {
        file = line.slice(6);
        continue;
      }
      const hunk = /^@@ [^@]+ @@ ?(.*)$/.exec(line);
      if (hunk) {
        context = hunk[1]!;
        inNew = false;
        continue;
      }
      if (!line.startsWith('+')) continue;
      added += 1;
      if (file.endsWith('.h')) continue; // declarations, not functions
      const body = line.slice(1);
      // A new top-level definition (its signature may wrap) owns the added lines up to its `}`.
      const definition =
        /^(?!static\s+thread_local)[A-Za-z_][\w\s:*&<>]*?\b([A-Za-z_][\w:]*)\s*\([^;]*$/.exec(body);
      if (definition) {
        functions.add(definition[1]!);
        inNew = true;
      } else if (body.startsWith('}')) {
        inNew = false;
      } else if (!inNew && /^\s+\S/.test(body) && context) {
        const name = /\b([A-Za-z_][\w:]*)\s*\(/.exec(context);
        if (name) functions.add(name[1]!);
      }
    }
  }
  return { added, functions };
}

it(`keeps upstream patches within ${BUDGET_LINES} added lines across ${BUDGET_FUNCTIONS} functions`, () => {
  const files = readdirSync(patchesDir).filter((f) => f.endsWith('.patch'));
  expect(files.length).toBeGreaterThan(0);
  const texts = files.map((f) => readFileSync(join(patchesDir, f), 'utf8'));
  for (const [i, text] of texts.entries()) {
    // Each patch opens with its one-line reason before the diff.
    expect(text.split('\n')[0], files[i]).toMatch(/^hydra: .{10,}/);
  }
  const { added, functions } = patchFootprint(texts);
  expect(added).toBeLessThanOrEqual(BUDGET_LINES);
  expect([...functions].length, [...functions].join(', ')).toBeLessThanOrEqual(BUDGET_FUNCTIONS);
});

it('counts lines and functions of a patch the way the budget means', () => {
  const sample = [
    'reason',
    '+++ b/x.cpp',
    '@@ -1,2 +1,9 @@ static void serve(int a) {',
    '+    count++;',
    '+static int helper(int x) {',
    '+    return x;',
    '+}',
    '+++ b/x.h',
    '@@ -1 +1,2 @@',
    '+int helper(int x);',
  ].join('\n');
  const { added, functions } = patchFootprint([sample]);
  expect(added).toBe(5);
  expect([...functions].sort()).toEqual(['helper', 'serve']);
});
