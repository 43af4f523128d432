// Starts `idem-lab conformance-env` and stops it (clients/conformance/README.md).
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root: clients/typescript/test/support -> four levels up. */
export const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");

const READY_WITHIN_MS = 120_000;
const STOP_WITHIN_MS = 10_000;
const STDERR_TAIL = 64 * 1024;

/** `IDEM_LAB_BIN`, else `<repo>/target/debug/idem-lab`. */
export function labBinary() {
  return process.env.IDEM_LAB_BIN || path.join(REPO_ROOT, "target", "debug", "idem-lab");
}

/**
 * Spawns the environment and resolves, once it printed its first stdout line,
 * with `{ info, stop, stderrTail }`: `info` is that line's JSON, `stop()`
 * closes its stdin and waits for it to end (killing it after 10 s).
 */
export async function startEnv() {
  const bin = labBinary();
  if (!existsSync(bin)) {
    throw new Error(
      `the conformance environment's binary is missing: ${bin} does not exist. ` +
        "Build it (cargo build -p idem-lab) or point IDEM_LAB_BIN at an idem-lab binary.",
    );
  }
  const child = spawn(bin, ["conformance-env"], { stdio: ["pipe", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => {
    stderr = (stderr + chunk).slice(-STDERR_TAIL);
  });
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  const stderrTail = () => stderr;

  const info = await new Promise((resolve, reject) => {
    let stdout = "";
    let done = false;
    const finish = (error, value) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (error) {
        child.kill("SIGKILL");
        reject(error);
      } else {
        resolve(value);
      }
    };
    const timer = setTimeout(
      () => finish(new Error(`${bin} conformance-env printed no line within ${READY_WITHIN_MS} ms; stderr:\n${stderr}`)),
      READY_WITHIN_MS,
    );
    child.on("error", (error) => finish(new Error(`could not start ${bin} conformance-env: ${error.message}`)));
    child.on("exit", (code, signal) =>
      finish(new Error(`${bin} conformance-env ended (code ${code}, signal ${signal}) before it was ready; stderr:\n${stderr}`)),
    );
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      if (done) return; // later output is drained and dropped
      stdout += chunk;
      const newline = stdout.indexOf("\n");
      if (newline < 0) return;
      const line = stdout.slice(0, newline);
      try {
        finish(null, JSON.parse(line));
      } catch (error) {
        finish(new Error(`conformance-env's first line is not JSON (${error.message}): ${line}`));
      }
    });
  });
  for (const name of ["idem", "lossy", "refused"]) {
    if (typeof info?.endpoints?.[name] !== "string") {
      child.kill("SIGKILL");
      throw new Error(`conformance-env's line has no endpoints.${name}: ${JSON.stringify(info)}`);
    }
  }
  if (typeof info.simulator !== "string" || typeof info.secret !== "string") {
    child.kill("SIGKILL");
    throw new Error(`conformance-env's line has no simulator or secret: ${JSON.stringify(info)}`);
  }

  let stopping;
  const stop = () => {
    stopping ??= (async () => {
      if (child.exitCode !== null || child.signalCode !== null) return exited;
      child.stdin.end();
      let timer;
      const killed = new Promise((resolve) => {
        timer = setTimeout(() => {
          child.kill("SIGKILL");
          resolve();
        }, STOP_WITHIN_MS);
      });
      await Promise.race([exited, killed]);
      clearTimeout(timer);
      return exited;
    })();
    return stopping;
  };
  return { info, stop, stderrTail };
}
