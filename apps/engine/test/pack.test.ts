import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';

const root = new URL('../../../', import.meta.url).pathname;
const PACKED = ['errors', 'hydra-rpc', 'tiering'];

// What another team does with our packages: pnpm pack (workspace:* becomes the version), then a
// plain npm install of the tarballs in a project that knows nothing of this repository.
it('pnpm pack tarballs install with plain npm in a scratch project; HydraClient and plan import and work', () => {
  const dir = mkdtempSync(join(tmpdir(), 'hydra-pack-'));
  const tarballs = join(dir, 'tarballs');
  mkdirSync(tarballs);
  for (const name of PACKED) {
    execFileSync('bash', [join(root, 'scripts/pnpm.sh'), 'pack', '--pack-destination', tarballs], {
      cwd: join(root, 'packages', name),
      stdio: ['ignore', 'ignore', 'pipe'],
    });
  }
  const files = readdirSync(tarballs).sort();
  expect(files).toEqual([
    'hydra-engine-errors-0.1.0.tgz',
    'hydra-engine-hydra-rpc-0.1.0.tgz',
    'hydra-engine-tiering-0.1.0.tgz',
  ]);
  for (const f of files) {
    const manifest = JSON.parse(
      execFileSync('tar', ['-xzOf', join(tarballs, f), 'package/package.json'], { encoding: 'utf8' }),
    ) as {
      license: string;
      repository: { url: string };
      engines: { node: string };
      dependencies?: Record<string, string>;
    };
    expect(JSON.stringify(manifest.dependencies ?? {})).not.toContain('workspace:');
    expect(manifest.license).toBe('MIT');
    expect(manifest.repository.url).toMatch(/^git\+https:/);
    expect(manifest.engines.node).toMatch(/^>=20/);
    const listing = execFileSync('tar', ['-tzf', join(tarballs, f)], { encoding: 'utf8' }).split('\n');
    expect(listing).toContain('package/LICENSE');
    expect(listing).toContain('package/dist/index.js');
    expect(listing.some((l) => l.startsWith('package/src/') || l.startsWith('package/test/'))).toBe(false);
  }
  const app = join(dir, 'app');
  mkdirSync(app);
  writeFileSync(
    join(app, 'package.json'),
    JSON.stringify({ name: 'scratch', private: true, type: 'module' }),
  );
  execFileSync(
    'npm',
    [
      'install',
      '--no-audit',
      '--no-fund',
      '--prefer-offline',
      '--loglevel=error',
      ...files.map((f) => join(tarballs, f)),
    ],
    { cwd: app, stdio: ['ignore', 'ignore', 'pipe'], timeout: 180_000 },
  );
  expect(existsSync(join(app, 'node_modules/@hydra-engine/errors/LICENSE'))).toBe(true);
  writeFileSync(
    join(app, 'check.mjs'),
    [
      "import { HydraClient } from '@hydra-engine/hydra-rpc';",
      "import { defaults, plan } from '@hydra-engine/tiering';",
      'const r = plan(defaults(), { sampling: { temp: 0.5 }, n_ctx: 8192 });',
      'console.log(JSON.stringify({ client: typeof HydraClient, connect: typeof HydraClient.prototype.hello, tier: r.tier, rebuild: r.rebuild, keys: r.contextKeys }));',
    ].join('\n'),
  );
  const out = JSON.parse(execFileSync(process.execPath, ['check.mjs'], { cwd: app, encoding: 'utf8' }));
  expect(out).toEqual({
    client: 'function',
    connect: 'function',
    tier: 'T2',
    rebuild: 'context',
    keys: ['n_ctx'],
  });
}, 240_000);
