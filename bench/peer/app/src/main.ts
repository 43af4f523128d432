// The peer idem is measured against (scripts/bench-vs-peer, bench/peer/README.md):
// NestJS 10 on express, POST /charges behind @node-idempotency/nestjs's
// @Idempotent() with the keys in Redis, one PostgreSQL insert into `charges`
// (bench/peer/schema.sql, created by the harness) per charge; GET / answers 200.
// Env: HOST (127.0.0.1), PORT (8202), DATABASE_URL, REDIS_URL, PG_POOL_MAX (20),
//      IDEM_TTL_S (86400), REQUIRE_KEY (1: refuse a POST without Idempotency-Key).
import 'reflect-metadata';
import { NestFactory } from '@nestjs/core';
import { AppModule } from './app.module';
import { loadConfig } from './config';

async function bootstrap(): Promise<void> {
  const config = loadConfig();
  const app = await NestFactory.create(AppModule.forConfig(config), { logger: ['error', 'warn'] });
  app.enableShutdownHooks();
  await app.listen(config.port, config.host);
  console.log(`peer (@node-idempotency/nestjs) on ${config.host}:${config.port}, pool ${config.poolMax}`);
}

bootstrap().catch((err) => {
  console.error(err);
  process.exit(1);
});
