import { defineConfig } from 'vitest/config';

// One engine process per file and files one after another: the suite measures the engine, so it
// must not compete with itself for the two CI cores.
export default defineConfig({
  test: { testTimeout: 120_000, hookTimeout: 120_000, pool: 'forks', fileParallelism: false },
});
