// The code tool an agent gets: run untrusted code in a fresh sandbox, with a
// timeout, and hand back what it printed and how it ended.
//
//   npm install /path/to/sandboxd/sdk/typescript   (after `npm ci && npm run build` there)
//   node run_agent_code.mjs                  # a demo
//   node run_agent_code.mjs script.py        # run a file
//   echo 'print(1)' | node run_agent_code.mjs --timeout 10 -
//
// It reaches the daemon through SANDBOXD_SOCKET (default
// /run/sandboxd/sandboxd.sock), or SANDBOXD_URL + SANDBOXD_TOKEN
// (+ SANDBOXD_TLS_FINGERPRINT) for a remote one.

import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

import { Sandbox, SandboxProcessError } from "sandboxd";

/**
 * Runs `code` (Python) in a throwaway sandbox without network access and
 * returns `{ stdout, stderr, exitCode, timedOut }`. A program still running
 * after `timeout` seconds is killed with everything it started.
 */
export async function runAgentCode(code, { timeout = 30, image = "python", memory = "1Gi" } = {}) {
  const sb = await new Sandbox({ image, cpu: 1, memory, blockNetwork: true, keepWarmSeconds: 600 }).create();
  try {
    // stdin: false: a program that reads input gets end of file, not a hang.
    const proc = await sb.process.runCode(code, { blocking: false, stdin: false });
    let timedOut = false;
    try {
      await proc.wait(timeout);
    } catch (error) {
      if (!(error instanceof SandboxProcessError)) throw error;
      timedOut = true;
      await proc.kill();
      await proc.wait(30);
    }
    const [stdout, stderr] = await Promise.all([proc.stdout.read(), proc.stderr.read()]);
    return { stdout, stderr, exitCode: proc.exitCode, timedOut };
  } finally {
    await sb.terminate();
  }
}

const DEMO = `
import platform, sys
print("hello from", platform.python_implementation(), platform.python_version())
print("squares:", [n * n for n in range(5)])
print("this goes to stderr", file=sys.stderr)
`;

async function main(argv) {
  let timeout = 30;
  const args = [...argv];
  const at = args.indexOf("--timeout");
  if (at !== -1) {
    timeout = Number(args[at + 1]);
    args.splice(at, 2);
  }
  const source = args[0];
  const code = source === undefined ? DEMO : readFileSync(source === "-" ? 0 : source, "utf8");
  const result = await runAgentCode(code, { timeout });
  process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).catch((error) => {
    console.error(`run_agent_code: ${error.message}`);
    process.exit(1);
  });
}
