/*
 * Hadoop's local file system, setting permissions with java.nio rather than a chmod child process.
 *
 * Without Hadoop's native library (pyspark ships none) RawLocalFileSystem.setPermission runs
 * chmod as a child of the JVM, and Hadoop sets the permission of every file it creates: each
 * offset and commit entry of a streaming query (and its .crc) cost a process start. Modes with
 * more than the nine rwx bits (setuid, setgid, sticky) still go through Hadoop's own way.
 * Built by spark_log/nio_filesystem.py; see there.
 */
package headwater.hadoop;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.io.nativeio.NativeIO;

public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** The raw (checksum-less) side: only setPermission differs from Hadoop's. */
  public static class Raw extends RawLocalFileSystem {
    /** Bit i of a mode (the lowest first) and its permission. */
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      int mode = permission.toShort();
      if (NativeIO.isAvailable() || (mode & ~0777) != 0) {
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> wanted = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          wanted.add(BITS[bit]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), wanted);
    }
  }
}
