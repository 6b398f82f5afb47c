/** Memory sizes as users write them, to the daemon's MiB. */

import { ConfigurationError } from "./errors.js";

const MIB = 1024 * 1024;
const UNITS: Record<string, number> = {
  b: 1,
  k: 1000,
  kb: 1000,
  ki: 1024,
  kib: 1024,
  m: 1000 ** 2,
  mb: 1000 ** 2,
  mi: MIB,
  mib: MIB,
  g: 1000 ** 3,
  gb: 1000 ** 3,
  gi: 1024 ** 3,
  gib: 1024 ** 3,
  t: 1000 ** 4,
  tb: 1000 ** 4,
  ti: 1024 ** 4,
  tib: 1024 ** 4,
};

/**
 * `512` (MiB, as Beam takes a number), `"512Mi"`, `"1Gi"`, `"1.5GiB"`,
 * `"2G"` (decimal units round up to whole MiB), `"512"` (MiB).
 */
export function parseMemory(memory: number | string): number {
  const bad = () =>
    new ConfigurationError(
      `memory ${JSON.stringify(memory)} is not a size: give MiB as a number (512) or a string like "512Mi" or "1Gi"`,
      { code: "invalid_memory", field: "memory" },
    );
  if (typeof memory === "number") {
    if (!Number.isFinite(memory) || memory <= 0) throw bad();
    return Math.ceil(memory);
  }
  const match = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(memory);
  if (!match) throw bad();
  const value = Number(match[1]);
  const unit = match[2].toLowerCase();
  const bytes = unit === "" ? value * MIB : UNITS[unit] === undefined ? NaN : value * UNITS[unit];
  if (!Number.isFinite(bytes) || bytes <= 0) throw bad();
  return Math.ceil(bytes / MIB - 1e-9);
}

/** Cores from a number (`1`, `0.5`) or a string (`"2"`, `"500m"` millicores). */
export function parseCpu(cpu: number | string): number {
  const cores =
    typeof cpu === "number"
      ? cpu
      : /^\s*\d+(\.\d+)?m\s*$/i.test(cpu)
        ? Number(cpu.trim().slice(0, -1)) / 1000
        : /^\s*\d+(\.\d+)?\s*$/.test(cpu)
          ? Number(cpu)
          : NaN;
  if (!Number.isFinite(cores) || cores <= 0) {
    throw new ConfigurationError(`cpu ${JSON.stringify(cpu)} is not a number of cores like 1, 0.5 or "500m"`, {
      code: "invalid_cpu",
      field: "cpu",
    });
  }
  return cores;
}
