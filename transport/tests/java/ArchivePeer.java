// Our own few lines against the real Aeron Archive (io.aeron:aeron-all), for the interop tests:
// compiled by the test with javac into a temporary directory; nothing of Aeron is kept here.
//
//   java ArchivePeer <aeronDir> <archiveDir> <recordChannel> <streamId> <replayChannel> <replayStreamId>
//
// Runs an ArchivingMediaDriver (SHARED threading, backoff idle, local IPC control only), records
// <recordChannel>/<streamId> from a remote publisher (ours), and when that image ends (EOS)
// prints "RECORDED <recordingId> <startPosition> <stopPosition>", replays the whole recording to
// <replayChannel>/<replayStreamId>, prints "REPLAYING", and waits for SIGINT.
import io.aeron.archive.Archive;
import io.aeron.archive.ArchiveThreadingMode;
import io.aeron.archive.ArchivingMediaDriver;
import io.aeron.archive.client.AeronArchive;
import io.aeron.archive.codecs.SourceLocation;
import io.aeron.driver.MediaDriver;
import io.aeron.driver.ThreadingMode;
import org.agrona.concurrent.BackoffIdleStrategy;
import org.agrona.concurrent.ShutdownSignalBarrier;

import java.io.File;

public final class ArchivePeer
{
    public static void main(final String[] args) throws Exception
    {
        final String aeronDir = args[0];
        final String recordChannel = args[2];
        final int streamId = Integer.parseInt(args[3]);
        final String replayChannel = args[4];
        final int replayStreamId = Integer.parseInt(args[5]);
        final MediaDriver.Context driverCtx = new MediaDriver.Context()
            .aeronDirectoryName(aeronDir)
            .dirDeleteOnStart(true)
            .dirDeleteOnShutdown(true)
            .threadingMode(ThreadingMode.SHARED)
            .sharedIdleStrategy(new BackoffIdleStrategy())
            .termBufferSparseFile(true);
        final Archive.Context archiveCtx = new Archive.Context()
            .aeronDirectoryName(aeronDir)
            .archiveDir(new File(args[1]))
            .deleteArchiveOnStart(true)
            .controlChannelEnabled(false)
            .archiveClientContext(new AeronArchive.Context().controlResponseChannel("aeron:ipc"))
            .replicationChannel("aeron:udp?endpoint=127.0.0.1:0")
            .recordingEventsEnabled(false)
            .threadingMode(ArchiveThreadingMode.SHARED)
            .idleStrategySupplier(BackoffIdleStrategy::new);
        final ShutdownSignalBarrier barrier = new ShutdownSignalBarrier();
        try (ArchivingMediaDriver driver = ArchivingMediaDriver.launch(driverCtx, archiveCtx);
            AeronArchive archive = AeronArchive.connect(new AeronArchive.Context()
                .aeronDirectoryName(aeronDir)
                .controlRequestChannel("aeron:ipc")
                .controlResponseChannel("aeron:ipc")))
        {
            archive.startRecording(recordChannel, streamId, SourceLocation.REMOTE);
            System.out.println("RECORDING " + recordChannel);
            final long[] found = {-1, 0}; // recording id, start position
            while (found[0] < 0)
            {
                archive.listRecordingsForUri(0, 10, "aeron:udp", streamId,
                    (controlSessionId, correlationId, id, startTimestamp, stopTimestamp, startPosition,
                    stopPosition, initialTermId, segmentFileLength, termBufferLength, mtuLength,
                    sessionId, sId, strippedChannel, originalChannel, sourceIdentity) ->
                    {
                        found[0] = id;
                        found[1] = startPosition;
                    });
                Thread.sleep(10);
            }
            final long recordingId = found[0];
            final long[] start = {found[1]};
            long stop;
            while ((stop = archive.getStopPosition(recordingId)) == AeronArchive.NULL_POSITION)
            {
                Thread.sleep(10);
            }
            System.out.println("RECORDED " + recordingId + " " + start[0] + " " + stop);
            archive.startReplay(recordingId, start[0], stop - start[0], replayChannel, replayStreamId);
            System.out.println("REPLAYING");
            barrier.await();
        }
    }
}
