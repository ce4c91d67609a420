// Adds up the vitest JSON reports of every workspace package into one closing line, so CI (and a
// person) sees one total: "test: N passed, N failed, N skipped".
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const roots = ['packages', 'apps', 'tests'];
const reports = [];
for (const root of roots) {
  for (const name of readdirSync(root)) reports.push(join(root, name, 'test-results.json'));
}
reports.push(join('benchmarks', 'test-results.json'));

let passed = 0;
let failed = 0;
let skipped = 0;
let missing = 0;
for (const file of reports) {
  const pkg = join(file, '..', 'package.json');
  if (!existsSync(pkg)) continue;
  const scripts = JSON.parse(readFileSync(pkg, 'utf8')).scripts ?? {};
  if (!scripts.test) continue;
  if (!existsSync(file)) {
    console.error(`no test report from ${file} (its test run did not finish)`);
    missing += 1;
    continue;
  }
  const report = JSON.parse(readFileSync(file, 'utf8'));
  passed += report.numPassedTests;
  failed += report.numFailedTests;
  // A suite that fails before its tests run (a throwing beforeAll, an import error) has no failed
  // test, only skipped ones: it must still count.
  if (report.success === false && report.numFailedTests === 0)
    failed += Math.max(1, report.numFailedTestSuites ?? 0);
  skipped += report.numPendingTests + report.numTodoTests;
  console.log(`${file.padEnd(44)} ${report.numPassedTests} passed, ${report.numFailedTests} failed`);
}
console.log(`test: ${passed} passed, ${failed + missing} failed, ${skipped} skipped`);
process.exit(failed + missing > 0 || passed === 0 ? 1 : 0);
