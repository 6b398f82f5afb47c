/**
 * sandboxd's TypeScript SDK: Beam's `Sandbox` surface in camelCase.
 *
 * ```ts
 * import { Sandbox, SandboxProcessError } from "sandboxd";
 * const sb = await new Sandbox({ cpu: 1, memory: "1Gi", image: "python", blockNetwork: true }).create();
 * try {
 *   const proc = await sb.process.runCode("print(6 * 7)", { blocking: false });
 *   try {
 *     await proc.wait(30);
 *   } catch (e) {
 *     if (e instanceof SandboxProcessError) await proc.kill();
 *     else throw e;
 *   }
 *   console.log(await proc.stdout.read(), await proc.stderr.read());
 * } finally {
 *   await sb.terminate();
 * }
 * ```
 */

export { Sandbox, SandboxInstance } from "./sandbox.js";
export { PreviewUrl } from "./ports.js";
export type { ListeningPort, PortInfo, PortAuth, PortProtocol } from "./ports.js";
export type { SandboxOptions, NetworkPermissions, ExposePortOptions } from "./sandbox.js";
export { SandboxProcess, SandboxProcessManager, ProcessStdin } from "./process.js";
export type { ProcessOptions, RunCodeOptions, ProcessResult } from "./process.js";
export { ProcessStream, ProcessLogs } from "./output.js";
export type { StreamName } from "./output.js";
export { SandboxFileSystem } from "./fs.js";
export type { WriteOptions, MkdirOptions } from "./fs.js";
export { Image, PythonVersion } from "./image.js";
export type { ImageOptions, ImageSpec } from "./image.js";
export {
  SandboxdError,
  SandboxConnectionError,
  TLSFingerprintError,
  ConfigurationError,
  SandboxProcessError,
  APIError,
  BadRequestError,
  AuthenticationError,
  PermissionDeniedError,
  NotFoundError,
  ConflictError,
  PayloadTooLargeError,
  CapacityError,
  ServerError,
  FeatureUnavailableError,
} from "./errors.js";
export { resolveConnection, normalizeFingerprint, DEFAULT_SOCKET } from "./config.js";
export type { ConnectionOptions, ResolvedConnection, Environment } from "./config.js";
export { Transport, transportFor, closeAllTransports } from "./transport.js";
export { createSandbox, newIdempotencyKey } from "./create.js";
export type { RetryPolicy } from "./create.js";
export { parseMemory, parseCpu } from "./units.js";
export type { SandboxInfo, ProcessInfo, FileInfo, SnapshotInfo } from "./types.js";
