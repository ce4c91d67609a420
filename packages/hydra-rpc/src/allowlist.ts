import { BlockList, isIPv4, isIPv6 } from 'node:net';
import { HydraError } from './errors.js';

/** Loopback only: the default of `--control-allow-from` (ggml-RPC has no authentication upstream). */
export const DEFAULT_ALLOW_FROM: readonly string[] = ['127.0.0.0/8', '::1/128'];

/**
 * A CIDR allowlist. IPv4-mapped IPv6 peers (`::ffff:a.b.c.d`, what a dual-stack listener reports)
 * are checked against the IPv4 rules, so `127.0.0.1/32` admits them.
 */
export class Allowlist {
  readonly #list = new BlockList();
  readonly #rules: readonly string[];

  /** Throws HYDRA_ERR_BAD_OPTION for an entry that is not `address` or `address/prefix`. */
  constructor(cidrs: readonly string[]) {
    for (const entry of cidrs) {
      const [address = '', prefixText, ...rest] = entry.trim().split('/');
      const type = isIPv4(address) ? 'ipv4' : isIPv6(address) ? 'ipv6' : undefined;
      const max = type === 'ipv4' ? 32 : 128;
      const prefix =
        prefixText === undefined ? max : /^\d{1,3}$/.test(prefixText) ? Number(prefixText) : Number.NaN;
      if (type === undefined || rest.length > 0 || !(prefix >= 0 && prefix <= max)) {
        throw new HydraError(
          'HYDRA_ERR_BAD_OPTION',
          `options.allowFrom has an invalid CIDR: ${JSON.stringify(entry)}`,
          {
            keys: ['allowFrom'],
          },
        );
      }
      const mapped = type === 'ipv6' ? unmapIPv4(address) : undefined;
      if (mapped !== undefined && prefix >= 96) this.#list.addSubnet(mapped, prefix - 96, 'ipv4');
      else this.#list.addSubnet(address, prefix, type);
    }
    this.#rules = [...cidrs];
  }

  /** The rules as given. */
  get rules(): readonly string[] {
    return this.#rules;
  }

  /** True when `address` (as `socket.remoteAddress` gives it) is allowed. */
  allows(address: string | undefined): boolean {
    if (address === undefined) return false;
    const mapped = unmapIPv4(address);
    if (mapped !== undefined) return this.#list.check(mapped, 'ipv4');
    if (isIPv4(address)) return this.#list.check(address, 'ipv4');
    if (isIPv6(address)) return this.#list.check(address, 'ipv6');
    return false;
  }
}

function unmapIPv4(address: string): string | undefined {
  const match = /^::ffff:(\d{1,3}(?:\.\d{1,3}){3})$/i.exec(address);
  return match !== null && isIPv4(match[1]!) ? match[1] : undefined;
}
