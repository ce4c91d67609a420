/**
 * The shape of a results file: every key path with the JSON type at it. Arrays are one `[]` step
 * (the union of their elements' shapes); figures are keyed by name, so two runs of the same parts
 * compare figure by figure. Free-form maps whose keys are data (model names, budgets, modes) are
 * collapsed to `*`.
 */
export function jsonShape(value: unknown, collapse: readonly RegExp[] = []): Set<string> {
  const out = new Set<string>();
  const walk = (v: unknown, path: string) => {
    const t = v === null ? 'null' : Array.isArray(v) ? 'array' : typeof v;
    out.add(`${path}: ${t}`);
    if (Array.isArray(v)) {
      if (path === '.figures')
        for (const f of v) walk(f, `.figures[${(f as { name?: string }).name ?? '?'}]`);
      else for (const x of v) walk(x, `${path}[]`);
    } else if (t === 'object') {
      const isMap = collapse.some((re) => re.test(path));
      for (const [k, x] of Object.entries(v as Record<string, unknown>))
        walk(x, `${path}.${isMap ? '*' : k}`);
    }
  };
  walk(value, '');
  return out;
}

/** Paths in one shape and not the other. */
export function shapeDiff(a: Set<string>, b: Set<string>): { onlyA: string[]; onlyB: string[] } {
  return { onlyA: [...a].filter((p) => !b.has(p)).sort(), onlyB: [...b].filter((p) => !a.has(p)).sort() };
}
