import { Pool } from 'pg';

// The injection token of the PostgreSQL pool.
export const PG_POOL = Symbol('PG_POOL');

export function createPool(databaseUrl: string, max: number): Pool {
  return new Pool({ connectionString: databaseUrl, max });
}
