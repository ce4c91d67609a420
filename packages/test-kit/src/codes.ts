/** The `code` of what `fn` throws (undefined when it returns, or throws something without one). */
export function errorCode(fn: () => unknown): string | undefined {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string } | null)?.code;
  }
  return undefined;
}
