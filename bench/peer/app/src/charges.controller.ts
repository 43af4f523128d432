import { Body, Controller, Get, Headers, HttpCode, Inject, Post } from '@nestjs/common';
import { Idempotent } from '@node-idempotency/nestjs';
import { Pool } from 'pg';
import { PG_POOL } from './db';

interface ChargeBody {
  amount: number;
  currency: string;
}

interface Charge {
  id: number;
  amount: number;
  currency: string;
  status: 'succeeded';
}

@Controller()
export class ChargesController {
  constructor(@Inject(PG_POOL) private readonly pool: Pool) {}

  // readiness: no database, no Redis
  @Get()
  ready(): string {
    return 'ok';
  }

  // One row per charge. The interceptor behind @Idempotent() claims the key in
  // Redis before this runs, answers replays and concurrent duplicates itself, and
  // stores this method's answer for the key's later requests.
  @Post('charges')
  @HttpCode(201)
  @Idempotent()
  async create(
    @Body() body: ChargeBody,
    @Headers('idempotency-key') key: string | undefined,
  ): Promise<Charge> {
    const { rows } = await this.pool.query<{ id: string }>(
      'INSERT INTO charges (idem_key, amount, currency) VALUES ($1, $2, $3) RETURNING id',
      [key ?? null, body.amount, body.currency],
    );
    return { id: Number(rows[0].id), amount: body.amount, currency: body.currency, status: 'succeeded' };
  }
}
