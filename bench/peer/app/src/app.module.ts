import { DynamicModule, Inject, Module, OnApplicationShutdown } from '@nestjs/common';
import { NodeIdempotencyModule, StorageAdapterEnum } from '@node-idempotency/nestjs';
import { Pool } from 'pg';
import { ChargesController } from './charges.controller';
import { Config } from './config';
import { createPool, PG_POOL } from './db';

@Module({})
export class AppModule implements OnApplicationShutdown {
  constructor(@Inject(PG_POOL) private readonly pool: Pool) {}

  static forConfig(config: Config): DynamicModule {
    return {
      module: AppModule,
      imports: [
        NodeIdempotencyModule.forRootAsync({
          // the library's own Redis storage adapter (@node-idempotency/storage-adapter-redis)
          storage: { adapter: StorageAdapterEnum.redis, options: { url: config.redisUrl } },
          cacheTTLMS: config.keyTtlMs,
          enforceIdempotency: config.requireKey,
        }),
      ],
      controllers: [ChargesController],
      providers: [{ provide: PG_POOL, useFactory: () => createPool(config.databaseUrl, config.poolMax) }],
    };
  }

  async onApplicationShutdown(): Promise<void> {
    await this.pool.end();
  }
}
