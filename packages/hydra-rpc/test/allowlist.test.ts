import { expect, it } from 'vitest';
import { Allowlist, DEFAULT_ALLOW_FROM, type HydraError } from '../src/index.js';

it('defaults to loopback only, IPv4-mapped IPv6 included', () => {
  const list = new Allowlist(DEFAULT_ALLOW_FROM);
  expect(list.allows('127.0.0.1')).toBe(true);
  expect(list.allows('127.9.9.9')).toBe(true);
  expect(list.allows('::1')).toBe(true);
  expect(list.allows('::ffff:127.0.0.1')).toBe(true);
  expect(list.allows('10.0.0.1')).toBe(false);
  expect(list.allows('::ffff:10.0.0.1')).toBe(false);
  expect(list.allows('fe80::1')).toBe(false);
  expect(list.allows(undefined)).toBe(false);
  expect(list.allows('not an address')).toBe(false);
});

it('matches IPv4 and IPv6 CIDRs and bare addresses', () => {
  const list = new Allowlist(['192.168.1.0/24', '10.1.2.3', '2001:db8::/32', '::ffff:172.16.0.0/112']);
  expect(list.allows('192.168.1.77')).toBe(true);
  expect(list.allows('192.168.2.1')).toBe(false);
  expect(list.allows('10.1.2.3')).toBe(true);
  expect(list.allows('10.1.2.4')).toBe(false);
  expect(list.allows('2001:db8:1::5')).toBe(true);
  expect(list.allows('2001:db9::5')).toBe(false);
  expect(list.allows('::ffff:192.168.1.9')).toBe(true);
  expect(list.allows('172.16.3.4')).toBe(true);
  expect(list.allows('172.17.0.1')).toBe(false);
  expect(new Allowlist([]).allows('127.0.0.1')).toBe(false);
});

it.each(['127.0.0.1/33', 'foo', '10.0.0.0/8/1', '::1/129', '10.0.0.0/x', ''])('rejects %j', (entry) => {
  try {
    new Allowlist([entry]);
    expect.unreachable();
  } catch (err) {
    expect((err as HydraError).code).toBe('HYDRA_ERR_BAD_OPTION');
  }
});
