import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { TextOutput } from '../src/core/output.js';

// A small alphabet with 1-, 2- and 4-byte UTF-8 characters, so stop strings collide with the text
// often and characters split across token bytes.
const char = fc.constantFrom('a', 'b', ' ', 'é', '€', '😀');
const text = fc.array(char, { maxLength: 40 }).map((a) => a.join(''));
const stop = fc.array(char, { minLength: 1, maxLength: 4 }).map((a) => a.join(''));

/** `s` as UTF-8 bytes cut at the given points (tokens need not end on character boundaries). */
function tokens(s: string, cuts: number[]): Uint8Array[] {
  const bytes = new TextEncoder().encode(s);
  const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Uint8Array[] = [];
  let from = 0;
  for (const c of [...at, bytes.length]) {
    if (c > from) out.push(bytes.subarray(from, c));
    from = Math.max(from, c);
  }
  return out;
}

function run(s: string, cuts: number[], stops: string[]): { out: TextOutput; sent: string[] } {
  const out = new TextOutput(stops);
  const sent: string[] = [];
  for (const t of tokens(s, cuts)) {
    sent.push(out.push(t));
    // What the client has seen never holds a stop string.
    for (const st of stops) expect(sent.join('').includes(st)).toBe(false);
    if (out.stopped) break;
  }
  if (!out.stopped) sent.push(out.end());
  return { out, sent };
}

describe('TextOutput', () => {
  it('without stop strings sends exactly the decoded text, in order, whatever the token cuts', () => {
    fc.assert(
      fc.property(text, fc.array(fc.nat(200)), (s, cuts) => {
        const { out, sent } = run(s, cuts, []);
        expect(sent.join('')).toBe(s);
        expect(out.text).toBe(s);
        expect(out.stopped).toBe(false);
        // A chunk never carries half a character.
        for (const c of sent) expect(c.includes('\uFFFD')).toBe(false);
      }),
      { numRuns: 500 },
    );
  });

  it('ends right before the first stop string to complete, and sends all of the text before it', () => {
    fc.assert(
      fc.property(text, fc.array(fc.nat(200)), fc.array(stop, { maxLength: 3 }), (s, cuts, stops) => {
        const { out, sent } = run(s, cuts, stops);
        const t = out.text;
        expect(sent.join('')).toBe(t);
        expect(s.startsWith(t)).toBe(true);
        const found = stops.some((st) => s.includes(st));
        expect(out.stopped).toBe(found);
        if (found) expect(stops.some((st) => s.startsWith(st, t.length))).toBe(true);
        else expect(t).toBe(s);
        // No stop string lies wholly inside the text: it would have ended the generation there.
        for (const st of stops) expect(t.includes(st)).toBe(false);
      }),
      { numRuns: 1000 },
    );
  });

  it('holds back a tail that may grow into a stop string and sends it once it cannot', () => {
    const out = new TextOutput(['END']);
    expect(out.push(new TextEncoder().encode('hello E'))).toBe('hello ');
    expect(out.push(new TextEncoder().encode('N'))).toBe('');
    expect(out.push(new TextEncoder().encode('x'))).toBe('ENx');
    expect(out.push(new TextEncoder().encode(' EN'))).toBe(' ');
    expect(out.end()).toBe('EN');
    expect(out.text).toBe('hello ENx EN');
  });

  it('turns bytes of an unfinished character into U+FFFD only at the end', () => {
    const euro = new TextEncoder().encode('€');
    const out = new TextOutput([]);
    expect(out.push(euro.subarray(0, 2))).toBe('');
    expect(out.end()).toBe('\uFFFD');
  });
});

describe('TextOutput marks (token probabilities)', () => {
  /** Pushes each token with its index as mark; records what each push released and the text sent by then. */
  function marked(s: string, cuts: number[], stops: string[]) {
    const out = new TextOutput<number>(stops);
    const toks = tokens(s, cuts);
    const starts: number[] = [];
    const released: { mark: number; sent: number; end: boolean }[] = [];
    let sent = '';
    for (let i = 0; i < toks.length; i++) {
      starts.push(out.decoded);
      sent += out.push(toks[i]!, i);
      for (const m of out.take()) released.push({ mark: m, sent: sent.length, end: out.stopped });
      if (out.stopped) break;
    }
    if (!out.stopped) {
      sent += out.end();
      for (const m of out.take()) released.push({ mark: m, sent: sent.length, end: true });
    }
    return { out, toks, starts, released };
  }

  it('reports every token once, in order, each with or after its first character', () => {
    fc.assert(
      fc.property(text, fc.array(fc.nat(200)), (s, cuts) => {
        const { toks, starts, released } = marked(s, cuts, []);
        expect(released.map((r) => r.mark)).toEqual(toks.map((_, i) => i));
        for (const r of released) if (!r.end) expect(r.sent).toBeGreaterThan(starts[r.mark]!);
      }),
      { numRuns: 500 },
    );
  });

  it('with a stop string: exactly the tokens whose text starts before the cut', () => {
    fc.assert(
      fc.property(text, fc.array(fc.nat(200)), fc.array(stop, { maxLength: 3 }), (s, cuts, stops) => {
        const { out, toks, starts, released } = marked(s, cuts, stops);
        const cut = out.text.length;
        const want = out.stopped
          ? toks.map((_, i) => i).filter((i) => i < starts.length && starts[i]! < cut)
          : toks.map((_, i) => i);
        expect(released.map((r) => r.mark)).toEqual(want);
        for (const r of released) if (!r.end) expect(r.sent).toBeGreaterThan(starts[r.mark]!);
      }),
      { numRuns: 1000 },
    );
  });

  it('a token cut wholly by the stop string is dropped, one that gave text before it is kept', () => {
    const out = new TextOutput<string>(['STOP']);
    const enc = (t: string) => new TextEncoder().encode(t);
    expect(out.push(enc('ab'), 'ab')).toBe('ab');
    expect(out.take()).toEqual(['ab']);
    expect(out.push(enc('cST'), 'cST')).toBe('c');
    expect(out.take()).toEqual(['cST']);
    expect(out.push(enc('O'), 'O')).toBe('');
    expect(out.push(enc('P!'), 'P!')).toBe('');
    expect(out.stopped).toBe(true);
    expect(out.take()).toEqual([]);
    expect(out.text).toBe('abc');
  });

  it('a token that ends inside a character goes out with the one that completes it', () => {
    const out = new TextOutput<number>([]);
    const euro = new TextEncoder().encode('€');
    expect(out.push(euro.subarray(0, 1), 0)).toBe('');
    expect(out.take()).toEqual([]);
    expect(out.push(euro.subarray(1), 1)).toBe('€');
    expect(out.take()).toEqual([0, 1]);
  });
});
