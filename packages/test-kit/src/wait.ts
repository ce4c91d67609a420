/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Polls `check` every 20 ms until it holds; throws `${what}: not met within N ms` once
 * `timeoutMs` has passed. A check that throws ends the wait with its error.
 */
export async function waitFor(
  check: () => Promise<boolean> | boolean,
  timeoutMs: number,
  what = 'condition',
): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (Date.now() < end) {
    if (await check()) return;
    await sleep(20);
  }
  throw new Error(`${what}: not met within ${timeoutMs} ms`);
}
