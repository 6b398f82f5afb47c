// One real daemon per test file: started before its tests, torn down after
// them with an assertion that nothing (mount, cgroup, folder) stayed behind.
// The SDK finds it through SANDBOXD_SOCKET, as a user's program would.

import assert from "node:assert/strict";
import { after, before } from "node:test";

import { closeAllTransports } from "../../dist/index.js";
import { startDaemon } from "./daemon.mjs";

/**
 * Registers the hooks; the returned object's `daemon` is set once started.
 * `extraArgs`: the daemon's flags, or an (async) function that makes them
 * when it starts (free ports).
 */
export function useDaemon(extraArgs = [], env = {}) {
  const ctx = { daemon: undefined };
  before(async () => {
    const args = typeof extraArgs === "function" ? await extraArgs() : extraArgs;
    ctx.daemon = await startDaemon(args, env);
    process.env.SANDBOXD_SOCKET = ctx.daemon.socket;
    delete process.env.SANDBOXD_URL;
  });
  after(async () => {
    closeAllTransports();
    if (ctx.daemon) {
      const leftovers = await ctx.daemon.stop();
      assert.deepEqual(leftovers, [], `left behind:\n${leftovers.join("\n")}`);
    }
  });
  return ctx;
}

/** Terminates every sandbox given, ignoring those already gone. */
export async function terminateAll(sandboxes) {
  await Promise.all(sandboxes.filter(Boolean).map((sb) => sb.terminate()));
}
