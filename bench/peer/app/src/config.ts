// Everything the peer reads from its environment, read once.
export interface Config {
  host: string;
  port: number;
  databaseUrl: string;
  redisUrl: string;
  poolMax: number;
  keyTtlMs: number;
  requireKey: boolean;
}

function int(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got ${raw}`);
  return n;
}

export function loadConfig(): Config {
  return {
    host: process.env.HOST ?? '127.0.0.1',
    port: int('PORT', 8202),
    databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/peer_bench',
    // the key records: the library's Redis storage adapter, database 2 unless told
    redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379/2',
    poolMax: int('PG_POOL_MAX', 20),
    keyTtlMs: int('IDEM_TTL_S', 86400) * 1000,
    // 1: a POST /charges without Idempotency-Key is refused (the library's enforceIdempotency)
    requireKey: process.env.REQUIRE_KEY === '1',
  };
}
