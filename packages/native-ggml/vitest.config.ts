import { defineConfig } from 'vitest/config';

// upstream/ holds llama.cpp's own web UI tests; only this package's folders are ours.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts', 'test-native/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
  },
});
